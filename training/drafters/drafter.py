"""What the training loop asks of a drafter, so training/loop.py reads once for EAGLE-3
(drafters/eagle3/step.py) and DFlash (drafters/dflash/step.py): build it on the verifier with the
module a step runs, run a step's forward and backward, turn the step's sums into its event's
fields, and say what its checkpoints and its `oom` event add. Each module also makes its
drafter's shape and knobs from `trackside train`'s flags (`config_from_flags`, with
`base_shape` here).

A step scores positions in units: EAGLE-3's are TTT steps, DFlash's block offsets. The loop
sums each unit's losses and agreements over the ranks and hands the means to
`step_fields`."""
from __future__ import annotations

import argparse
import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Protocol

import torch
from torch import Tensor, nn

from training.contract import UsageError
from training.data import Dataset
from training.packing import PackedBatch


class Scored(Protocol):
    """One unit's scored positions on this rank."""
    losses: Tensor  # [P] float32
    agree: Tensor  # [P] bool: the drafter's top token is the target


class Drafter(ABC):
    """One drafter's part of the training loop, for one run's settings."""

    @abstractmethod
    def build(self, dataset: Dataset, device: torch.device, share: tuple[int, int]
              ) -> tuple[nn.Module, nn.Module]:
        """The drafter, built and filled on the device on the verifier's weights, and the
        module a step runs: the one DDP wraps and FSDP's root group holds. `share`: this
        process's (rank, world size)."""

    def own_groups(self, drafter: nn.Module) -> Sequence[nn.Module]:
        """The drafter's modules FSDP gathers as groups of their own; the rest is the
        root group's."""
        return ()

    @abstractmethod
    def forward_backward(self, step: nn.Module, batch: PackedBatch, loss_chunk: int,
                         world: int, host: PackedBatch) -> tuple[list[Scored], list[float]]:
        """Backward through the step's loss over the global batch. Returns each unit's
        scored positions on this rank and their count over all ranks. host: the batch as
        the loader made it, on the host (batch itself on a CPU run), where what the step
        must know before queuing its kernels can be read without waiting on the device."""

    @abstractmethod
    def step_fields(self, losses: list[float], accuracies: list[float], counts: list[float]
                    ) -> dict:
        """The step event's `loss` and the drafter's own fields, from each unit's mean
        loss, accuracy and count over the global batch (training/metrics.py)."""

    def checkpoint_extras(self) -> dict:
        """What its checkpoints' config.json holds beside the run's."""
        return {}

    @abstractmethod
    def oom_params(self) -> dict:
        """The parameters an `oom` event names beside max_seq_len; None: not this drafter's."""


def base_shape(args: argparse.Namespace, dataset: Dataset, kind, presets: dict,
               other: str, own: str):
    """The drafter shape `trackside train`'s flags name (--model-config's JSON, else
    --preset, else tiny) as a `kind` config, and that flag; refused where it is the other
    drafter's preset or its hidden size is not the data's."""
    if args.model_config is not None:
        try:
            base = kind.from_dict(json.loads(args.model_config.read_text()))
        except (OSError, ValueError, TypeError) as exc:
            raise UsageError(f"--model-config {args.model_config}: {exc}") from None
        flag = "--model-config"
    else:
        name = args.preset or "tiny"
        if name not in presets:
            raise UsageError(f"--preset {name} is {other}; {own}'s are "
                             + ", ".join(sorted(presets)))
        base, flag = presets[name], "--preset"
    if base.hidden_size != dataset.hidden_size:
        raise UsageError(f"{flag}: the drafter's hidden size {base.hidden_size} differs from "
                         f"the data's {dataset.hidden_size} (the verifier's)")
    return base, flag
