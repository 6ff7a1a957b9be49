"""The training loop, top to bottom: set-up, resume, steps, checkpoints, the end.

One process per GPU under torchrun (gloo on CPU, NCCL on CUDA), or one process alone.
Each rank trains on its slice of the global batch; the loss is normalised by the global
count of scored positions per TTT step, so N ranks compute exactly what one process with
the whole global batch would. `sharding` says how ranks hold the drafter: "ddp" replicates
it (DistributedDataParallel), "fsdp" shards its trained parameters, their gradients and
AdamW state over the ranks (FSDP2's fully_shard, `shard`). Rank 0 writes metrics and
checkpoints; a checkpoint holds the whole drafter and its optimizer state by parameter
name, gathered from every rank, so it resumes at any world size and either sharding. The
step itself
(make_optimizer, forward_backward, optimizer_step) is also what `trackside fit --probe`
measures.

Exit codes: 0 done or stopped by SIGTERM/SIGINT (after a checkpoint), 3 CUDA out of memory
(placing the model, resuming or in a step).
"""
from __future__ import annotations

import dataclasses
import math
import random
import re
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

from training import checkpoint, contract, durable
from training.config import DFlashConfig, DrafterConfig
from training.contract import EXIT_OK, EXIT_OOM
from training.data import Dataset, Loader, Position
from training.device import autocast, peak_mem_gib, precision
from training.distributed import (all_reduce, gather_state, join_processes, leave_processes,
                                  live_state, restore_state, spread)
from training.metrics import MetricsWriter
from training.mirror import Mirror
from training.model import Eagle3Drafter, StepLoss
from training.packing import PackedBatch
from training.vocab import build_draft_vocab

if TYPE_CHECKING:
    from training.dflash.run import DFlashTraining

@dataclass
class TrainConfig:
    data: Path
    run_dir: Path
    drafter: DrafterConfig | DFlashConfig
    steps: int | None = None  # exactly one of steps and epochs
    epochs: int | None = None
    max_seq_len: int = 2048
    ttt_steps: int = 3
    ttt_decay: float = 0.8
    lr: float = 1e-4
    batch_rows: int = 1  # rows per rank per step
    device: str = "cpu"
    resume: bool = False
    # Another run's checkpoints dir to start from (a relaunch's parent's), its writer
    # waited for: the parent's checkpoint is still being made durable as this one starts.
    resume_from: Path | None = None
    loss_chunk: int = 2048
    checkpoint_ttt: int = 0  # TTT steps recomputed in backward, the first ones (model.step_losses)
    freeze_lm_head: bool = False  # the draft head stays the verifier's (model.freeze_lm_head)
    gpu_mem_gib: float | None = None
    save_every: int = 0  # 0: only at the end and when stopped
    seed: int = 0
    grad_clip: float = 1.0
    weight_decay: float = 0.0
    export: Path | None = None
    dflash: DFlashTraining | None = None  # set: train a DFlash drafter, not EAGLE-3
    sharding: str = "ddp"  # one of training.memory.SHARDINGS

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        del d["drafter"]
        d["model"] = self.drafter.to_dict()  # the key `trackside fit --from-run` reads
        return {k: str(v) if isinstance(v, Path) else v for k, v in d.items()}


class ResumeError(ValueError):
    """The checkpoint to resume does not fit the run as now configured."""


class Unroll(nn.Module):
    """The drafter's per-step losses as a forward(), so DDP and FSDP see the call they
    sync; `step_losses` reads them back. Plain tensors: FSDP hooks its gradient
    reduction on the outputs it finds, and torch 2.11's looks for them by pytree, which
    does not look inside a StepLoss (2.13's does): the reduction never ran and every
    sharded parameter's gradient was None after backward (H200, one process)."""

    def __init__(self, drafter: Eagle3Drafter):
        super().__init__()
        self.drafter = drafter

    def forward(self, batch: PackedBatch, ttt_steps: int, loss_chunk: int,
                checkpoint: int = 0) -> tuple[torch.Tensor, ...]:
        return tuple(t for s in self.drafter.step_losses(batch, ttt_steps, loss_chunk,
                                                         checkpoint)
                     for t in (s.total, s.losses, s.agree, s.index))

    @staticmethod
    def step_losses(outputs: tuple[torch.Tensor, ...]) -> list[StepLoss]:
        return [StepLoss(*outputs[i:i + 4]) for i in range(0, len(outputs), 4)]


class _StopRequest:
    """SIGTERM / SIGINT ask for a clean stop after the current step.

    Once a stop is under way (this rank was asked, or another rank was and the step's
    all-reduce said so), SIGTERM is ignored until the process exits: torchrun's agent and
    a kill that signals every node send it again while the rank saves, writes its end
    event and leaves the process group, and its default action then would kill the rank
    mid-exit (ignored, it does not interrupt a system call either). SIGKILL remains the
    hard stop; SIGINT gets its handler back, so a second Ctrl-C at the terminal still
    interrupts."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.requested = False  # this process was signalled
        self.requested_at: float | None = None  # time.monotonic() of the first signal
        self._stopping = False
        self._previous = {sig: signal.signal(sig, self._handle) for sig in self.SIGNALS}

    def _handle(self, signum, frame) -> None:
        self.requested = True
        self.requested_at = self.requested_at or time.monotonic()

    def since(self) -> str:
        """Seconds since this process was signalled, for the stop path's lines."""
        return f"{time.monotonic() - self.requested_at:.2f} s after the signal" if self.requested_at else "(signalled elsewhere)"

    def under_way(self) -> None:
        """Every rank stops after this step."""
        self._stopping = True
        signal.signal(signal.SIGTERM, signal.SIG_IGN)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            if sig == signal.SIGTERM and (self._stopping or self.requested):
                handler = signal.SIG_IGN
            signal.signal(sig, handler)


def warmup_cosine(warmup: int, total: int, floor: float = 0.1):
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
    return factor


def _rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _tried_gib(error: Exception) -> float | None:
    m = re.search(r"Tried to allocate ([\d.]+) (GiB|MiB|KiB)", str(error))
    if not m:
        return None
    return float(m.group(1)) / {"GiB": 1, "MiB": 1024, "KiB": 1024**2}[m.group(2)]


def _folds_clip(optimizer: torch.optim.Optimizer) -> bool:
    """Whether optimizer takes GradScaler's grad_scale (torch's fused Adam and AdamW; a
    private attribute, so its absence means the plain clip, never no clip)."""
    return (getattr(optimizer, "_step_supports_amp_scaling", False)
            and hasattr(torch.nn.utils, "get_total_norm"))  # torch >= 2.6


def make_optimizer(params, lr: float, device: torch.device,
                   weight_decay: float = 0.0) -> torch.optim.AdamW:
    return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=weight_decay,
                             fused=device.type == "cuda")


# A training step is forward_backward then optimizer_step; two functions, because
# `trackside fit --probe` measures the peak memory of each phase on its own.
def forward_backward(model: nn.Module, batch: PackedBatch, ttt_steps: int, ttt_decay: float,
                     loss_chunk: int, world: int = 1, checkpoint: int = 0
                     ) -> tuple[list[StepLoss], list[float]]:
    """Backward through Σ_k decay^k · (TTT step k's mean loss over the global batch).
    Returns each TTT step's losses and its scored positions over all ranks."""
    device = batch.input_ids.device
    with autocast(device):
        per_step = Unroll.step_losses(model(batch, ttt_steps, loss_chunk, checkpoint))
    counts = all_reduce([float(s.losses.shape[0]) for s in per_step], device, world)
    # Each rank's share of the global mean; DDP averages gradients over ranks.
    loss = sum(ttt_decay ** k * s.total * (world / max(n, 1))
               for k, (s, n) in enumerate(zip(per_step, counts)))
    loss.backward()
    return per_step, counts


def optimizer_step(optimizer: torch.optim.Optimizer, params, grad_clip: float) -> torch.Tensor:
    """Clip, step, drop the gradients; returns the norm before clipping."""
    params = list(params)
    grads = [p.grad for p in params if p.grad is not None]
    # sharded gradients (DTensors) take clip_grad_norm_, which reduces the norm over ranks
    if _folds_clip(optimizer) and not any(hasattr(g, "full_tensor") for g in grads):
        grad_norm = torch.nn.utils.get_total_norm(grads)
        # Fused AdamW divides every gradient by grad_scale as it reads them (the protocol
        # torch.amp.GradScaler drives), so the clip costs no pass of its own over the
        # gradients. clip_grad_norm_ scales by grad_clip / (norm + 1e-6) when below 1.
        optimizer.grad_scale = ((grad_norm + 1e-6) / grad_clip).clamp(min=1.0)
        try:
            optimizer.step()
        finally:
            del optimizer.grad_scale
    else:
        grad_norm = torch.nn.utils.clip_grad_norm_(params, grad_clip)
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    # Sharded gradients give a DTensor norm, already reduced over the ranks: its value is
    # the whole drafter's norm, as DDP's is.
    return grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm


def record_oom(metrics: MetricsWriter, cfg: TrainConfig, device: torch.device,
               error: torch.OutOfMemoryError) -> int:
    """The `oom` and `end` events and the message for an OOM; the exit code."""
    if cfg.dflash is None:
        params = {"ttt_steps": cfg.ttt_steps}
    else:
        params = {"ttt_steps": None, "block_size": cfg.drafter.block_size,
                  "max_anchors": cfg.dflash.max_anchors}
    metrics.write(contract.OOM, max_seq_len=cfg.max_seq_len, **params,
                  tried_gib=_tried_gib(error), peak_mem_gib=peak_mem_gib(device))
    metrics.write(contract.END, status=contract.ENDED_OOM)
    said = " ".join(f"{k}={v}" for k, v in params.items() if v is not None)
    print(f"train: CUDA out of memory at max_seq_len={cfg.max_seq_len} "
          f"{said}: {error}", file=sys.stderr, flush=True)
    return EXIT_OOM


def train(cfg: TrainConfig) -> int:
    # --- processes and device ---
    device, rank, world = join_processes(cfg.device, cfg.sharding)
    if device.type == "cuda" and cfg.gpu_mem_gib:
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(
            min(1.0, cfg.gpu_mem_gib * 2**30 / total), device)
    torch.manual_seed(cfg.seed)

    # Where a start-up's seconds went, in the start event: imports and the device (to
    # here), the data, the model, the resume.
    phases, phase_began = {}, time.time()
    phases["imports_device"] = phase_began - contract.PROCESS_STARTED

    def phase_done(name: str) -> None:
        nonlocal phase_began
        now = time.time()
        phases[name], phase_began = now - phase_began, now

    # --- data ---
    dataset = Dataset(cfg.data)
    loader = Loader(dataset, cfg.max_seq_len, cfg.batch_rows, seed=cfg.seed, rank=rank,
                    world_size=world, pin_memory=device.type == "cuda")
    total_steps = cfg.steps or cfg.epochs * loader.steps_per_epoch
    warmup = max(1, min(100, total_steps // 10))
    if cfg.dflash is None:  # DFlash drafts over the verifier's whole vocabulary
        d2t, t2d = build_draft_vocab(dataset.token_counts(), cfg.drafter.draft_vocab_size)

    metrics = MetricsWriter(cfg.run_dir / "metrics.jsonl" if rank == 0 else None)
    stop, batches, status = None, None, contract.COMPLETED
    # Out of memory anywhere from here (placing the model, a resumed optimizer state, a
    # step) is an `oom` event and exit 3.
    try:
        phase_done("data")
        # --- model, optimizer ---
        # Built and filled on the device: initialising a 1B-parameter drafter on the CPU
        # and copying it over took most of a relaunch's start-up.
        if cfg.dflash is None:
            with torch.device(device):
                drafter = Eagle3Drafter(cfg.drafter)
            # Handed over as read from disk: the drafter moves the embedding and only the
            # head's draft-vocabulary rows (a quarter of it for llama3-8b) to the device.
            verifier = dataset.verifier()
            drafter.load_verifier(verifier["embed_tokens"], verifier["lm_head"], d2t, t2d)
            del verifier
            if cfg.freeze_lm_head:
                drafter.freeze_lm_head()
            unroll = Unroll(drafter)
        else:
            from training.dflash import run as dflash

            drafter, unroll = dflash.build(cfg.drafter, cfg.dflash, dataset, device,
                                           (rank, world))
        # EAGLE-3's one layer is the root group's: it runs once per TTT step and
        # model.py reads its down_proj weight before its forward (once per unroll),
        # where a group of its own would not yet be gathered; and one layer is most of
        # the drafter, gathered whole either way. DFlash's layers run once each.
        unroll = spread(unroll, () if cfg.dflash is None else drafter.layers, cfg.sharding,
                        device, world)
        # After sharding: fully_shard puts sharded parameters in the modules' place.
        trainable = {n: p for n, p in drafter.named_parameters() if p.requires_grad}
        optimizer = make_optimizer(trainable.values(), cfg.lr, device, cfg.weight_decay)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer,
                                                      warmup_cosine(warmup, total_steps))

        phase_done("model")
        # --- resume ---
        ckpt_root = cfg.run_dir / "checkpoints"
        step, position = 0, Position()
        source = cfg.resume_from or (ckpt_root if cfg.resume else None)
        if source is not None:  # after the start-up above, which overlaps a writer still writing
            try:
                durable.wait_for_writer(source, lambda said: rank == 0 and print(
                    f"train: --resume: {said}", flush=True))
            except durable.WriterBusy as busy:
                raise ResumeError(str(busy)) from None
        found = checkpoint.latest(source) if source is not None else None
        if found is not None:
            tensors, state, saved = checkpoint.load(found)
            missing = set(trainable) - set(tensors)
            if missing:
                raise ResumeError(f"checkpoint {found} lacks {sorted(missing)[:3]}")
            if saved.get("freeze_lm_head", False) != cfg.freeze_lm_head:
                raise ResumeError(f"checkpoint {found} was trained with"
                                  f"{'' if saved.get('freeze_lm_head') else 'out'} "
                                  "--freeze-lm-head: resume it the same way")
            # A sharded parameter's shape is its whole tensor's, as saved.
            for n, p in trainable.items():
                if tensors[n].shape != p.shape:
                    raise ResumeError(f"checkpoint {found} does not fit this drafter: {n} "
                                      f"is {tuple(tensors[n].shape)} there, "
                                      f"{tuple(p.shape)} here")
            restore_state(drafter, optimizer, {n: tensors[n] for n in trainable},
                          checkpoint.optimizer_by_name(state["optimizer"], list(trainable)))
            scheduler.load_state_dict(state["scheduler"])
            step, position = state["step"], Position(**state["data"])
            _set_rng_state(state["rng"])
        elif source is not None and rank == 0:
            print(f"train: --resume: no checkpoint in {source}: starting at step 0", flush=True)

        phase_done("resume")
        config = {**cfg.to_dict(), "total_steps": total_steps, "warmup_steps": warmup,
                  "global_batch_rows": cfg.batch_rows * world, "resumed_from_step": step,
                  "precision": precision(device),
                  "data_layers": dataset.info["layers"]}
        metrics.write(contract.START, config=config, process_started=contract.PROCESS_STARTED,
                      startup_s={k: round(v, 3) for k, v in phases.items()},
                      steps_per_epoch=loader.steps_per_epoch,
                      world_size=world)
        if rank == 0:
            print(f"train: run_dir={cfg.run_dir} steps={total_steps} "
                  f"steps_per_epoch={loader.steps_per_epoch} world_size={world} "
                  f"device={device.type} start_step={step}", flush=True)
        last_saved = step

        def state(optimizer_state: dict) -> dict:
            return {"step": step, "data": position.state_dict(), "rng": _rng_state(),
                    "optimizer": optimizer_state, "scheduler": scheduler.state_dict()}

        # A stop's release-first save copies into this, built after the first step
        # (training/mirror.py); rank 0 of an unsharded run, which holds the whole state.
        mirror = None
        mirrored = cfg.sharding != "fsdp" and rank == 0 and cfg.export is None

        def mirror_said(built) -> None:
            what = f"train: for a stop, {built.nbytes / 2**30:.2f} GiB of RAM"
            if built.failed:
                print(f"{what} not made ready ({built.failed}): a stop copies the state "
                      "the slower way", flush=True)
            else:
                print(f"{what} ready in {built.build_s:.2f} s (mapped"
                      + (", page-locked)" if device.type == "cuda" else ")"), flush=True)

        def save(release_first: bool = False) -> None:
            """Checkpoint this step. `release_first` (stopping): get the state off the
            device into RAM (the mirror where it is built), and leave the durable write to
            a writer process, so this one can exit and free the device before the write is
            done (training/durable.py)."""
            nonlocal last_saved
            sharded = cfg.sharding == "fsdp"
            # FSDP gathers on every rank; unsharded, rank 0 holds it all and the others
            # would copy the whole state to the CPU for nothing.
            if last_saved != step and (sharded or rank == 0):
                started = time.perf_counter()
                images = None
                if release_first and mirror is not None:
                    weights, optimizer_state = live_state(drafter, optimizer)
                    files, skeleton = checkpoint.tensor_files(weights, state(optimizer_state))
                    images = mirror.fill(files)
                if images is None:
                    if release_first and mirror is not None:
                        print("train: stopping the ordinary way: the RAM for it "
                              + (f"was not made ready ({mirror.failed})" if mirror.failed
                                 else "is not ready yet"), flush=True)
                    weights, optimizer_state = gather_state(drafter, optimizer, sharded)
                    files, skeleton = checkpoint.tensor_files(weights, state(optimizer_state))
                else:
                    files = {}  # they are the mirror's images
                off_device_s = time.perf_counter() - started
                if rank == 0:
                    staged = checkpoint.stage(ckpt_root, step, files, skeleton, {
                        "drafter": cfg.drafter.to_dict(), "layers": dataset.info["layers"],
                        "num_layers": dataset.info["num_layers"],
                        "max_seq_len": cfg.max_seq_len, "ttt_steps": cfg.ttt_steps,
                        "freeze_lm_head": cfg.freeze_lm_head,
                        **({} if cfg.dflash is None else {"dflash": cfg.to_dict()["dflash"]})},
                        ram=release_first)
                    del weights, optimizer_state, files
                    stage_s = time.perf_counter() - started
                    writer = (durable.hand_off(staged, ckpt_root, step,
                                               cfg.run_dir / "metrics.jsonl", images)
                              if release_first else None)
                    if writer is None:
                        path = durable.publish(staged, ckpt_root, step, images)
                        metrics.write(contract.CHECKPOINT, step=step, path=str(path))
                    else:
                        metrics.write(contract.STAGED, step=step, writer=writer,
                                      stage_s=round(stage_s, 3))
                        where = "RAM made ready for it" if images else staged.parent
                        print(f"train: step {step}'s state written to {where} in "
                              f"{stage_s:.2f} s ({off_device_s:.2f} s of it off the device), "
                              f"{stop.since()}; checkpoint writer pid {writer} makes it "
                              "durable", flush=True)
            last_saved = step
            if world > 1:
                dist.barrier()

        # --- the steps ---
        stop, batches = _StopRequest(), loader.iterate(position)
        while step < total_steps:
            started = time.perf_counter()
            batch, epoch, next_position = next(batches)
            batch = batch.to(device, non_blocking=True)
            if cfg.dflash is None:
                per_step, counts = forward_backward(unroll, batch, cfg.ttt_steps,
                                                    cfg.ttt_decay, cfg.loss_chunk, world,
                                                    cfg.checkpoint_ttt)
            else:  # per block offset where EAGLE-3 has per TTT step
                per_step, counts = dflash.forward_backward(unroll, batch, cfg.drafter,
                                                           cfg.dflash, cfg.loss_chunk, world)
            grad_norm = optimizer_step(optimizer, trainable.values(), cfg.grad_clip)
            lr = scheduler.get_last_lr()[0]
            scheduler.step()
            step, position = step + 1, next_position

            tokens = batch.input_ids.numel() - batch.pad_tokens
            # Each rank's peak in its own slot: the same all-reduce gathers them all.
            peaks = [0.0] * world
            peaks[rank] = peak_mem_gib(device)
            # Every step's loss and agreement sums in one read from the device, not 2K
            per_step_sums = torch.stack([s.losses.sum().double() for s in per_step]
                                        + [s.agree.sum().double() for s in per_step]).tolist()
            sums = all_reduce(
                per_step_sums
                + [tokens, batch.num_samples, batch.pad_tokens, float(stop.requested)]
                + peaks,
                device, world)
            peaks, stop_requested = sums[-world:], sums[-world - 1]
            K = len(per_step)
            loss_ttt = [sums[k] / max(counts[k], 1) for k in range(K)]
            acc_ttt = [sums[K + k] / max(counts[k], 1) for k in range(K)]
            if cfg.dflash is None:
                losses = dict(loss=sum(cfg.ttt_decay ** k * v for k, v in enumerate(loss_ttt)),
                              loss_ttt=loss_ttt, acc_ttt=acc_ttt)
            else:
                losses = dflash.step_fields(loss_ttt, acc_ttt, counts, cfg.drafter, cfg.dflash)
            tokens, samples, pad = sums[2 * K:2 * K + 3]
            rows = cfg.batch_rows * world
            elapsed = time.perf_counter() - started
            record = dict(
                step=step, epoch=epoch, **losses, lr=lr, grad_norm=grad_norm.item(),
                tokens=int(tokens), tokens_per_s=tokens / elapsed,
                samples_per_row=samples / rows, pad_frac=pad / (rows * cfg.max_seq_len),
                peak_mem_gib=peaks[0])
            if world > 1:
                record["peak_mem_gib_ranks"] = peaks
            metrics.write(contract.STEP, **record)
            if rank == 0:
                print(f"step={step} epoch={epoch} loss={record['loss']:.4f} "
                      f"acc_0={acc_ttt[0]:.3f} lr={lr:.3e} grad_norm={record['grad_norm']:.3f} "
                      f"tokens_per_s={record['tokens_per_s']:.0f} "
                      f"peak_mem_gib={record['peak_mem_gib']:.2f}", flush=True)
            if stop_requested > 0:  # any rank was asked to stop
                status = contract.STOPPED
                stop.under_way()
                break
            if cfg.save_every and step % cfg.save_every == 0:
                save()
            if mirrored and mirror is None:
                weights, optimizer_state = live_state(drafter, optimizer)
                files, _ = checkpoint.tensor_files(weights, state(optimizer_state))
                mirror = Mirror.start(files, device, on_done=mirror_said)
                del weights, optimizer_state, files
                if mirror.failed:
                    mirror_said(mirror)
        # An export reads the checkpoint as soon as the loop ends: written here, then.
        save(release_first=status == contract.STOPPED and cfg.export is None)
    except torch.OutOfMemoryError as error:
        return record_oom(metrics, cfg, device, error)
    except ResumeError:  # nothing was run: the run's record stays as it ended
        raise
    except BaseException:
        metrics.write(contract.END, status=contract.FAILED)
        raise
    finally:
        if stop is not None:
            stop.restore()
            batches.close()

    if cfg.export is not None and rank == 0:
        from training.export import export_drafter

        export_drafter(checkpoint.latest(ckpt_root), cfg.export)
    metrics.write(contract.END, status=status)
    metrics.close()
    leave_processes()
    if status == contract.STOPPED and rank == 0:
        print(f"train: stopped; exiting {stop.since()}", flush=True)
    return EXIT_OK
