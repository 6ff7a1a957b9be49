"""Resuming a checkpoint into a run as now configured: the checkpoint read from its writer's
RAM while the writer makes it durable (training/ram_stage.py), else the writer waited for
and the durable one read; checked against the drafter, then its weights, AdamW state,
schedule, data position and random state restored, each rank taking its shard
(training/distributed.py). The random state is saved here too (`rng_state`), so both
halves read the same fields."""
from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from torch import nn

from training import checkpoint, durable, ram_stage
from training.contract import RESUMED_FROM_DISK, RESUMED_FROM_RAM
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


@dataclass
class Resumed:
    step: int
    position: Position
    source: str | None = None  # where a checkpoint was restored from (contract.RESUME_SOURCES)
    wait_s: float = 0.0  # of it, waiting for a writer to make the checkpoint durable


def _from_ram(source: Path, say) -> tuple[tuple, str] | None:
    """(weights, state, config) and what it was, from the RAM stage a writer of `source`
    offers; None where none is taken (said, where one was offered)."""
    try:
        stage = ram_stage.take(source, checkpoint.TENSOR_FILES, checkpoint.TEXT_FILES)
    except ram_stage.NotOffered as why:
        if str(why):
            say(f"the checkpoint writer's RAM is not read ({why})")
        return None
    what = f"step {stage.step}'s state in its checkpoint writer's RAM (pid {stage.pid})"
    with stage:
        newest = checkpoint.latest(source)
        if newest is not None and int(newest.name.removeprefix("step-")) > stage.step:
            return None  # a newer durable one: this writer's step is not the latest
        try:
            read = checkpoint.read({name: stage.path(name) for name in stage.fds}, stage.texts)
        except (ValueError, SafetensorError) as error:
            say(f"{what} is not read: {error}")
            return None
    if not isinstance(read[1], dict) or read[1].get("step") != stage.step:
        say(f"{what} is not read: its state.json is another step's")
        return None
    return read, what


def resume(source: Path | None, rank: int, world: int, drafter: nn.Module,
           trainable: dict[str, nn.Parameter], optimizer: torch.optim.Optimizer,
           scheduler, freeze_lm_head: bool, required: bool = False) -> Resumed:
    """The step and data position to go on from: the newest checkpoint in `source` (a
    checkpoints dir) restored into the drafter, its optimizer and scheduler; step 0 where
    there is none (ResumeError if `required`: another run's checkpoint was asked for), or
    no source. A process alone reads the state from a writer's RAM where one offers it;
    ranks of a process group read the durable checkpoint, so that all read the same one."""
    if source is None:
        return Resumed(0, Position())

    def say(said: str) -> None:
        if rank == 0:
            print(f"train: --resume: {said}", flush=True)

    # after the start-up, which overlaps a writer still writing
    taken = _from_ram(source, say) if world == 1 else None
    waited = 0.0
    if taken is not None:
        (tensors, state, saved), found = taken
        say(f"{found} read while it makes it durable")
    else:
        began = time.perf_counter()
        try:
            durable.wait_for_writer(source, say)
        except durable.WriterBusy as busy:
            raise ResumeError(str(busy)) from None
        waited = time.perf_counter() - began
        found = checkpoint.latest(source)
        if found is None:
            if required:
                raise ResumeError(f"no checkpoint in {source} to start from")
            say(f"no checkpoint in {source}: starting at step 0")
            return Resumed(0, Position())
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
    return Resumed(state["step"], Position(**state["data"]),
                   RESUMED_FROM_RAM if taken else RESUMED_FROM_DISK, waited)
