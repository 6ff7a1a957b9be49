"""Resuming a checkpoint into a run as now configured: the writer waited for, the
checkpoint checked against the drafter, then its weights, AdamW state, schedule, data
position and random state restored, each rank taking its shard (training/distributed.py).
The random state is saved here too (`rng_state`), so both halves read the same fields."""
from __future__ import annotations

import random
from pathlib import Path

import torch
from torch import nn

from training import checkpoint, durable
from training.data import Position
from training.distributed import restore_state


class ResumeError(ValueError):
    """The checkpoint to resume does not fit the run as now configured."""


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def resume(source: Path | None, rank: int, drafter: nn.Module,
           trainable: dict[str, nn.Parameter], optimizer: torch.optim.Optimizer,
           scheduler, freeze_lm_head: bool, required: bool = False) -> tuple[int, Position]:
    """The step and data position to go on from: the newest checkpoint in `source` (a
    checkpoints dir) restored into the drafter, its optimizer and scheduler; step 0 where
    there is none (ResumeError if `required`: another run's checkpoint was asked for), or
    no source."""
    if source is not None:  # after the start-up, which overlaps a writer still writing
        try:
            durable.wait_for_writer(source, lambda said: rank == 0 and print(
                f"train: --resume: {said}", flush=True))
        except durable.WriterBusy as busy:
            raise ResumeError(str(busy)) from None
    found = checkpoint.latest(source) if source is not None else None
    if found is None:
        if required:
            raise ResumeError(f"no checkpoint in {source} to start from")
        if source is not None and rank == 0:
            print(f"train: --resume: no checkpoint in {source}: starting at step 0", flush=True)
        return 0, Position()
    tensors, state, saved = checkpoint.load(found)
    missing = set(trainable) - set(tensors)
    if missing:
        raise ResumeError(f"checkpoint {found} lacks {sorted(missing)[:3]}")
    if saved.get("freeze_lm_head", False) != freeze_lm_head:
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
    _set_rng_state(state["rng"])
    return state["step"], Position(**state["data"])
