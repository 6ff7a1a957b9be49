"""The trainer's processes and how they hold the drafter: the process group (one process
per GPU under torchrun, gloo on CPU and NCCL on CUDA, or one process alone), the
all-reduces every step's sums take, DDP or FSDP over the module a step runs, and the
drafter's state gathered whole from its ranks and handed back to them.

`sharding` says how ranks hold the drafter: "ddp" replicates it (DistributedDataParallel),
"fsdp" shards its trained parameters, their gradients and AdamW state over the ranks
(FSDP2's fully_shard, `shard`). A checkpoint holds the whole drafter and its optimizer
state by parameter name, gathered from every rank (`gather_state`), so it resumes at any
world size and either sharding (`restore_state`).
"""
from __future__ import annotations

import functools
import os
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from training import checkpoint
from training.device import use_cpu_threads, use_cuda_allocator_settings


def join_processes(device_type: str, sharding: str = "ddp") -> tuple[torch.device, int, int]:
    """This process's device, rank and world size; under torchrun (WORLD_SIZE > 1) the
    process group joined, once: the CLI joins before it decides whether --out is free,
    train() finds it joined. FSDP's device mesh needs a group even for one process, which
    then makes one of its own (FSDP alone shards nothing, but it runs, so a run relaunched
    on one GPU keeps its argv and the sharded path can be tried on a single card)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if device_type == "cuda":
        use_cuda_allocator_settings()
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        use_cpu_threads()
        device = torch.device("cpu")
    backend = "nccl" if device.type == "cuda" else "gloo"
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend)
    elif sharding == "fsdp" and not dist.is_initialized():
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return device, rank, world


def leave_processes() -> None:
    """Leave the process group, where this process joined one."""
    if dist.is_initialized():
        _host_group.cache_clear()
        dist.destroy_process_group()


@functools.cache
def _host_group() -> dist.ProcessGroup:
    """The ranks again, over gloo: host values summed there are never copied to a GPU
    and read back, which would wait for all the GPU was given. Made at the first sum,
    which every rank reaches in the same order."""
    return dist.new_group(backend="gloo")


def all_reduce(values: list[float], world: int) -> list[float]:
    """Each host value summed over the ranks, in one float64 all-reduce on the host."""
    if world == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, group=_host_group())
    return t.tolist()


def sum_over_ranks(t: torch.Tensor, world: int) -> torch.Tensor:
    """t summed over the ranks, in place, where it lies: values still on the device are
    summed there, and read once after."""
    if world > 1:
        dist.all_reduce(t)
    return t


def spread(step_module: nn.Module, layers: Sequence[nn.Module], sharding: str,
           device: torch.device, world: int) -> nn.Module:
    """The module a step runs, as the ranks hold it: sharded in place under "fsdp"
    (`shard`, each of `layers` a group of its own), wrapped in DDP over several ranks
    under "ddp", itself in one process."""
    if sharding == "fsdp":
        shard(step_module, layers, device, world)
    elif world > 1:
        step_module = DistributedDataParallel(step_module, device_ids=[device.index]
                                              if device.type == "cuda" else None)
    return step_module


def shard(model: nn.Module, layers, device: torch.device, world: int) -> nn.Module:
    """FSDP2 over every rank: each of `layers` its own group (gathered for its forward and
    again for its backward, then freed), the rest of `model` one group, gathered for the
    whole step. Frozen parameters (the verifier's embedding, a frozen draft head) stay
    whole on every rank: they take no gradient and no optimizer state, so sharding them
    would save nothing and cost a gather each step. Parameters are gathered in fp32 and
    autocast casts them, as under DDP: the same numbers, and the same dtypes the compiled
    islands and the Triton loss were written for."""
    # FSDP, DTensor and torch.distributed.checkpoint (gather_state, restore_state) are
    # imported where used: at module level they added ~1.2 s to every trainer's start.
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (world,))
    frozen = {p for p in model.parameters() if not p.requires_grad}
    for layer in layers:
        fully_shard(layer, mesh=mesh, ignored_params=frozen)
    fully_shard(model, mesh=mesh, ignored_params=frozen)
    return model


def live_state(drafter: nn.Module, optimizer: torch.optim.Optimizer
               ) -> tuple[dict[str, torch.Tensor], dict]:
    """The drafter's weights (not the verifier's embedding; a frozen head, which an export
    needs, too) and its optimizer state keyed by parameter name: the live tensors, not
    copies. Unsharded runs only: any rank holds it all."""
    frozen = {n for n, p in drafter.named_parameters() if not p.requires_grad}
    weights = {n: t.detach() for n, t in drafter.state_dict().items() if n not in frozen}
    weights.update(_frozen_kept(drafter))
    names = [n for n, p in drafter.named_parameters() if p.requires_grad]  # its order
    return weights, checkpoint.optimizer_by_name(optimizer.state_dict(), names)


def _frozen_kept(drafter: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach() for n, p in drafter.named_parameters()
            if not p.requires_grad and n != "embed_tokens.weight"}


def gather_state(drafter: nn.Module, optimizer: torch.optim.Optimizer, sharded: bool
                 ) -> tuple[dict[str, torch.Tensor], dict]:
    """live_state, whole and on the CPU. Sharded, every rank calls it (FSDP gathers the
    shards) and rank 0 gets the result."""
    if not sharded:
        weights, optimizer_state = live_state(drafter, optimizer)
        return ({n: t.cpu() for n, t in weights.items()},
                {**optimizer_state, "state": {
                    n: {k: v.cpu() if torch.is_tensor(v) else v for k, v in s.items()}
                    for n, s in optimizer_state["state"].items()}})
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions, get_model_state_dict, get_optimizer_state_dict)
    whole = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
    weights = get_model_state_dict(drafter, options=whole)
    weights.update({n: t.cpu() for n, t in _frozen_kept(drafter).items()})
    return weights, get_optimizer_state_dict(drafter, optimizer, options=whole)


def restore_state(drafter: nn.Module, optimizer: torch.optim.Optimizer,
                  weights: dict[str, torch.Tensor], optimizer_state: dict) -> None:
    """Whole tensors, as gather_state made them, into this run's parameters and optimizer,
    each rank taking its shard under FSDP: a checkpoint resumes at any world size."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions, set_model_state_dict, set_optimizer_state_dict)
    whole = StateDictOptions(full_state_dict=True, strict=False)
    set_model_state_dict(drafter, weights, options=whole)
    set_optimizer_state_dict(drafter, optimizer, optimizer_state, options=whole)
