"""The EAGLE-3 drafter inside the training loop (training/loop.py): its shape from the
flags, building it on the verifier with its draft vocabulary, one step's unrolled forward
and backward, and its step fields (a loss and accuracy per TTT step). `forward_backward` is also what
`trackside fit --probe` measures (probe.py)."""
from __future__ import annotations

import argparse
import contextlib
import dataclasses

import torch
from torch import nn

from training.config import PRESETS, DrafterConfig
from training.contract import UsageError
from training.data import Dataset
from training.device import autocast
from training.distributed import all_reduce
from training.drafters.drafter import Drafter, base_shape
from training.drafters.eagle3.vocab import build_draft_vocab, default_draft_vocab_size
from training.drafters.eagle3.model import (Eagle3Drafter, Positions, StepLoss,
                                            scored_positions)
from training.offload import HostOffload
from training.packing import PackedBatch
from training.params import PARAMS


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
                checkpoint: int = 0, positions: Positions | None = None
                ) -> tuple[torch.Tensor, ...]:
        return tuple(t for s in self.drafter.step_losses(batch, ttt_steps, loss_chunk,
                                                         checkpoint, positions)
                     for t in (s.total, s.losses, s.agree, s.index))

    @staticmethod
    def step_losses(outputs: tuple[torch.Tensor, ...]) -> list[StepLoss]:
        return [StepLoss(*outputs[i:i + 4]) for i in range(0, len(outputs), 4)]


# A training step is forward_backward then optimizer_step (training/optimizer.py); two
# functions, because `trackside fit --probe` measures the peak memory of each phase on its
# own.
def forward_backward(model: nn.Module, batch: PackedBatch, ttt_steps: int, ttt_decay: float,
                     loss_chunk: int, world: int = 1, checkpoint: int = 0,
                     offload: bool = False, host: PackedBatch | None = None
                     ) -> tuple[list[StepLoss], list[float]]:
    """Backward through Σ_k decay^k · (TTT step k's mean loss over the global batch).
    Returns each TTT step's losses and its scored positions over all ranks. `offload`:
    what backward keeps (the recomputed TTT steps' inputs, the loss's gradients) waits in
    pinned host memory instead of on the device (training/offload.py). host: the batch as
    the loader made it, on the host (None: batch), where the scored positions are found."""
    device = batch.input_ids.device
    positions = scored_positions(host or batch, ttt_steps).onto(device)
    kept_on_host = (HostOffload(resident=(batch.aux_hidden, batch.final_hidden)) if offload
                    else contextlib.nullcontext())
    with autocast(device), kept_on_host:
        per_step = Unroll.step_losses(model(batch, ttt_steps, loss_chunk, checkpoint,
                                            positions))
    counts = all_reduce([float(s.losses.shape[0]) for s in per_step], world)
    # Each rank's share of the global mean; DDP averages gradients over ranks.
    loss = sum(ttt_decay ** k * s.total * (world / max(n, 1))
               for k, (s, n) in enumerate(zip(per_step, counts)))
    loss.backward()
    return per_step, counts


class Eagle3(Drafter):
    def __init__(self, cfg: DrafterConfig, ttt_steps: int, ttt_decay: float,
                 checkpoint_ttt: int, freeze_lm_head: bool, offload_saved: bool = False,
                 fp8: bool = False):
        self.cfg, self.ttt_steps, self.ttt_decay = cfg, ttt_steps, ttt_decay
        self.checkpoint_ttt, self.freeze_lm_head = checkpoint_ttt, freeze_lm_head
        self.offload_saved, self.fp8 = offload_saved, fp8

    def build(self, dataset: Dataset, device: torch.device, share: tuple[int, int]
              ) -> tuple[Eagle3Drafter, Unroll]:
        d2t, t2d = build_draft_vocab(dataset.token_counts(), self.cfg.draft_vocab_size)
        # Built and filled on the device: initialising a 1B-parameter drafter on the CPU
        # and copying it over took most of a relaunch's start-up.
        with torch.device(device):
            drafter = Eagle3Drafter(self.cfg, self.fp8)
        # Handed over as read from disk: the drafter moves the embedding and only the
        # head's draft-vocabulary rows (a quarter of it for llama3-8b) to the device.
        verifier = dataset.verifier()
        drafter.load_verifier(verifier["embed_tokens"], verifier["lm_head"], d2t, t2d)
        del verifier
        if self.freeze_lm_head:
            drafter.freeze_lm_head()
        return drafter, Unroll(drafter)

    # own_groups: none. Its one layer is the root group's: it runs once per TTT step and
    # model.py reads its weights before its forward, once per unroll (down_proj's in bf16,
    # every projection's in fp8), where a group of its own would not yet be gathered; and
    # one layer is most of the drafter, gathered whole either way.

    def forward_backward(self, step: nn.Module, batch: PackedBatch, loss_chunk: int,
                         world: int, host: PackedBatch) -> tuple[list[StepLoss], list[float]]:
        return forward_backward(step, batch, self.ttt_steps, self.ttt_decay, loss_chunk,
                                world, self.checkpoint_ttt, self.offload_saved, host)

    def step_fields(self, losses: list[float], accuracies: list[float], counts: list[float]
                    ) -> dict:
        """The loss the backward took (each TTT step's mean, decayed), loss_ttt, acc_ttt."""
        return dict(loss=sum(self.ttt_decay ** k * v for k, v in enumerate(losses)),
                    loss_ttt=losses, acc_ttt=accuracies)

    def oom_params(self) -> dict:
        return {"ttt_steps": self.ttt_steps}


def config_from_flags(args: argparse.Namespace, dataset: Dataset) -> DrafterConfig:
    """The shape `trackside train`'s flags ask for, fitted to the data's vocabulary and
    draft vocabulary; a flag that does not fit the data is refused, named."""
    base, flag = base_shape(args, dataset, DrafterConfig, PRESETS,
                            "a DFlash shape (--drafter dflash)", "EAGLE-3")
    layers = dataset.info["layers"]
    if layers and len(layers) != 3:
        raise UsageError(f"--data: EAGLE-3 reads 3 verifier layers, the data carries "
                         f"{len(layers)} ({layers}); extract 3, or train --drafter dflash")
    vocab = dataset.vocab_size
    draft = args.draft_vocab_size or min(base.draft_vocab_size,
                                         default_draft_vocab_size(vocab))
    if draft > vocab:
        raise UsageError(f"--draft-vocab-size {draft} exceeds the verifier's vocabulary "
                         f"of {vocab}")
    return dataclasses.replace(base, vocab_size=vocab, draft_vocab_size=draft)


def from_flags(args: argparse.Namespace, dataset: Dataset) -> dict:
    """TrainConfig's fields for the run `trackside train`'s flags ask for: the shape and
    the unroll's knobs (a knob not given: the parameter table's default)."""
    ttt_steps = args.ttt_steps or PARAMS["ttt_steps"].default
    return dict(drafter=config_from_flags(args, dataset), ttt_steps=ttt_steps,
                ttt_decay=args.ttt_decay or PARAMS["ttt_decay"].default,
                checkpoint_ttt=min(args.checkpoint_ttt or 0, ttt_steps),
                freeze_lm_head=bool(args.freeze_lm_head), offload_saved=bool(args.offload_saved))
