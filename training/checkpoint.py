"""Checkpoints that a kill -9 at any moment cannot corrupt.

    checkpoints/step-<N>/model.safetensors   the drafter's weights (not the embedding), d2t/t2d
    checkpoints/step-<N>/config.json         drafter shape and data facts, for export
    checkpoints/step-<N>/state.pt            optimizer, scheduler, data position, RNG
    checkpoints/latest                       "step-<N>", repointed last

Tensors are whole, whatever the sharding of the run that wrote them (training/loop.py
gathers them to rank 0), and the optimizer state is keyed by parameter name: a checkpoint
resumes at another world size, under DDP or FSDP. One written before that keyed it by
the optimizer's parameter order; `optimizer_by_name` reads both.

A step directory is written whole under a temporary name, fsynced, then renamed: any
`step-*` directory is complete. `latest` is a small file replaced by rename after that, so
it never names a missing directory; loading still falls back to the newest step directory
in case the pointer's own rename was the thing interrupted.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

KEEP = 2
_STEP_DIR = re.compile(r"^step-(\d+)$")
_TMP_PREFIX = ".tmp-"


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _step_dirs(root: Path) -> list[tuple[int, Path]]:
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name))]
    return sorted(found)


def save(root: Path, step: int, tensors: dict[str, Tensor], state: dict,
         config: dict) -> Path:
    """Write step-<step> atomically, repoint `latest`, prune to the newest KEEP."""
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(_TMP_PREFIX + "*"):  # left by a writer that was killed
        if stale.is_dir():
            shutil.rmtree(stale)
        else:
            stale.unlink()
    final = root / f"step-{step}"
    tmp = root / f"{_TMP_PREFIX}step-{step}"
    tmp.mkdir()
    save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()},
              tmp / "model.safetensors")
    torch.save(state, tmp / "state.pt")
    (tmp / "config.json").write_text(json.dumps(config, indent=1))
    for f in tmp.iterdir():
        _fsync_path(f)
    _fsync_path(tmp)
    if final.exists():  # a resumed run saving the same step again
        _discard(final)
    os.rename(tmp, final)
    _fsync_path(root)

    pointer_tmp = root / f"{_TMP_PREFIX}latest"
    pointer_tmp.write_text(final.name + "\n")
    _fsync_path(pointer_tmp)
    os.replace(pointer_tmp, root / "latest")
    _fsync_path(root)

    for _, old in _step_dirs(root)[:-KEEP]:
        _discard(old)
    return final


def _discard(step_dir: Path) -> None:
    # Renamed away first, so a kill during the deletion leaves no half step directory.
    doomed = step_dir.with_name(f"{_TMP_PREFIX}old-{step_dir.name}")
    os.rename(step_dir, doomed)
    shutil.rmtree(doomed)


def latest(root: Path) -> Path | None:
    """The newest complete checkpoint directory, or None.

    Every step directory is complete, and the newest is never older than what `latest`
    names (the pointer moves after the rename), so the directory listing decides.
    """
    dirs = _step_dirs(root)
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
