"""Checkpoints that a kill -9 at any moment cannot corrupt.

    checkpoints/step-<N>/model.safetensors   the drafter's weights (not the embedding), d2t/t2d
    checkpoints/step-<N>/config.json         drafter shape and data facts, for export
    checkpoints/step-<N>/state.pt            optimizer, scheduler, data position, RNG
    checkpoints/latest                       "step-<N>", repointed last

Tensors are whole, whatever the sharding of the run that wrote them (training/loop.py
gathers them to rank 0), and the optimizer state is keyed by parameter name: a checkpoint
resumes at another world size, under DDP or FSDP. One written before that keyed it by
the optimizer's parameter order; `optimizer_by_name` reads both.

A step directory is written whole under a temporary name, fsynced, then renamed, and
`latest` repointed after that (training/durable.py, which also hands that half to a writer
process when the trainer stops): any `step-*` directory is complete, and loading still
falls back to the newest step directory in case the pointer's own rename was the thing
interrupted.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from training import durable



def save(root: Path, step: int, tensors: dict[str, Tensor], state: dict,
         config: dict) -> Path:
    """Write step-<step> atomically, repoint `latest`, prune to the newest KEEP."""
    return durable.publish(stage(root, step, tensors, state, config), root, step)


def stage(root: Path, step: int, tensors: dict[str, Tensor], state: dict, config: dict,
          ram: bool = False) -> Path:
    """Write step-<step>'s files, unsynced, where durable.publish takes them from (with
    `ram`, in /dev/shm if it has room); the directory they are in."""
    size = sum(t.numel() * t.element_size() for t in _tensors([tensors, state])) if ram else None
    staged = durable.stage_dir(root, step, ram_bytes=size)
    save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()},
              staged / "model.safetensors")
    # A stopping trainer's state.pt without its CRC32s: computing them was half the time of
    # writing it (torch.load reads it either way; durability is the publish's rename).
    torch.serialization.set_crc32_options(not ram)
    try:
        torch.save(state, staged / "state.pt")
    finally:
        torch.serialization.set_crc32_options(True)
    (staged / "config.json").write_text(json.dumps(config, indent=1))
    return staged


def _tensors(tree) -> list[Tensor]:
    if torch.is_tensor(tree):
        return [tree]
    if isinstance(tree, dict):
        tree = list(tree.values())
    return [t for item in tree for t in _tensors(item)] if isinstance(tree, (list, tuple)) else []


def latest(root: Path) -> Path | None:
    """The newest complete checkpoint directory, or None.

    Every step directory is complete, and the newest is never older than what `latest`
    names (the pointer moves after the rename), so the directory listing decides.
    """
    dirs = durable.step_dirs(root)
    return dirs[-1][1] if dirs else None


def load(path: Path) -> tuple[dict[str, Tensor], dict, dict]:
    """(tensors, state, config) of one checkpoint directory."""
    tensors = load_file(path / "model.safetensors")
    # On the CPU first: every rank resumes on its own GPU, and load_state_dict moves the
    # optimizer state to each parameter's device.
    state = torch.load(path / "state.pt", map_location="cpu", weights_only=False)
    config = json.loads((path / "config.json").read_text())
    return tensors, state, config


def optimizer_by_name(saved: dict, names: list[str]) -> dict:
    """A checkpoint's optimizer state keyed by parameter name, as
    torch.distributed.checkpoint.state_dict's get_optimizer_state_dict keys it. `names`:
    the trained parameters in the order they were handed to the optimizer, which is how a
    checkpoint from before FSDP keyed them (by position)."""
    if all(isinstance(p, str) for group in saved["param_groups"] for p in group["params"]):
        return saved
    return {"state": {names[i]: s for i, s in saved["state"].items()},
            "param_groups": [{**group, "params": [names[i] for i in group["params"]]}
                             for group in saved["param_groups"]]}
