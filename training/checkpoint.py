"""Checkpoints that a kill -9 at any moment cannot corrupt.

    checkpoints/step-<N>/model.safetensors   the drafter's weights (not the embedding), d2t/t2d
    checkpoints/step-<N>/state.safetensors   the state's tensors: optimizer moments, RNG
    checkpoints/step-<N>/state.json          the rest of the state: step, data position,
                                             scheduler, optimizer groups; tensors by key
    checkpoints/step-<N>/config.json         drafter shape and data facts, for export
    checkpoints/latest                       "step-<N>", repointed last

Tensors are whole, whatever the sharding of the run that wrote them (training/distributed.py
gathers them to rank 0), and the optimizer state is keyed by parameter name: a checkpoint
resumes at another world size, under DDP or FSDP. One written before that keyed it by
the optimizer's parameter order; `optimizer_by_name` reads both.

Every tensor is in a safetensors file, nothing is pickled: a stopping trainer's files can
be laid out in RAM ahead of time and published by a process without torch
(training/mirror.py, training/durable.py). Checkpoints from before kept the state in one
pickled `state.pt`; `load` still reads them.

A step directory is written whole under a temporary name, fsynced, then renamed, and
`latest` repointed after that (training/durable.py, which also hands that half to a writer
process when the trainer stops): any `step-*` directory is complete, and loading still
falls back to the newest step directory in case the pointer's own rename was the thing
interrupted.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor

from training import durable

WEIGHTS, STATE_TENSORS, STATE_JSON, CONFIG = (
    "model.safetensors", "state.safetensors", "state.json", "config.json")
TENSOR_FILES, TEXT_FILES = {WEIGHTS, STATE_TENSORS}, {STATE_JSON, CONFIG}
LEGACY_STATE = "state.pt"
# state.json's stand-ins for what JSON has no word for
TENSOR, TUPLE = "__tensor__", "__tuple__"


def tensor_files(weights: dict[str, Tensor], state: dict) -> tuple[dict[str, dict[str, Tensor]], dict]:
    """A checkpoint's tensor files (file name → key → tensor, wherever the tensors are)
    and state.json's content, which names each of the state's tensors by its key."""
    state_tensors: dict[str, Tensor] = {}
    skeleton = _to_json(state, "", state_tensors)
    return {WEIGHTS: weights, STATE_TENSORS: state_tensors}, skeleton


def _to_json(tree, path: str, tensors: dict[str, Tensor]):
    if torch.is_tensor(tree):
        tensors[path] = tree
        return {TENSOR: path}
    if isinstance(tree, dict):
        if not all(isinstance(k, str) for k in tree):
            raise TypeError(f"checkpoint state {path or '/'}: keys must be strings")
        return {k: _to_json(v, f"{path}/{k}".lstrip("/"), tensors) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        items = [_to_json(v, f"{path}/{i}".lstrip("/"), tensors) for i, v in enumerate(tree)]
        return {TUPLE: items} if isinstance(tree, tuple) else items
    return tree


def _from_json(tree, tensors: dict[str, Tensor]):
    if isinstance(tree, dict):
        if TENSOR in tree:
            return tensors[tree[TENSOR]]
        if TUPLE in tree:
            return tuple(_from_json(v, tensors) for v in tree[TUPLE])
        return {k: _from_json(v, tensors) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_from_json(v, tensors) for v in tree]
    return tree


def save(root: Path, step: int, weights: dict[str, Tensor], state: dict,
         config: dict) -> Path:
    """Write step-<step> atomically, repoint `latest`, prune to the newest KEEP."""
    files, skeleton = tensor_files(weights, state)
    return durable.publish(stage(root, step, files, skeleton, config), root, step)


def stage(root: Path, step: int, files: dict[str, dict[str, Tensor]], skeleton: dict,
          config: dict, ram: bool = False) -> Path:
    """Write step-<step>'s files, unsynced, where durable.publish takes them from (with
    `ram`, in /dev/shm if it has room); the directory they are in. `files` may be
    empty: their images are then handed to publish apart (training/mirror.py)."""
    size = sum(t.numel() * t.element_size() for f in files.values() for t in f.values()) if ram else None
    staged = durable.stage_dir(root, step, ram_bytes=size)
    try:
        for name, tensors in files.items():
            _save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()},
                       staged / name)
        (staged / STATE_JSON).write_text(json.dumps(skeleton))
        (staged / CONFIG).write_text(json.dumps(config, indent=1))
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)  # a half-written step, its room given back
        raise
    return staged


def _save_file(tensors: dict[str, Tensor], path: Path) -> None:
    """save_file, its I/O errors raised as OSError with their errno (safetensors reports
    the OS's error in its own exception, the errno only in the text), so a full disk is
    ENOSPC wherever it is met."""
    try:
        save_file(tensors, path)
    except SafetensorError as error:
        code = re.search(r"os error (\d+)", str(error))
        if code is None:
            raise
        number = int(code.group(1))
        raise OSError(number, os.strerror(number), str(path)) from None


def latest(root: Path) -> Path | None:
    """The newest complete checkpoint directory, or None.

    Every step directory is complete, and the newest is never older than what `latest`
    names (the pointer moves after the rename), so the directory listing decides.
    """
    dirs = durable.step_dirs(root)
    return dirs[-1][1] if dirs else None


def load(path: Path) -> tuple[dict[str, Tensor], dict, dict]:
    """(weights, state, config) of one checkpoint directory, on the CPU: every rank
    resumes on its own GPU, and load_state_dict moves the optimizer state to each
    parameter's device."""
    if (path / LEGACY_STATE).exists():
        state = torch.load(path / LEGACY_STATE, map_location="cpu", weights_only=False)
        return load_file(path / WEIGHTS), state, json.loads((path / CONFIG).read_text())
    return read({name: path / name for name in TENSOR_FILES},
                {name: (path / name).read_text() for name in TEXT_FILES})


def read(tensor_files: dict[str, str | Path], texts: dict[str, str]) -> tuple[dict[str, Tensor], dict, dict]:
    """(weights, state, config) of a checkpoint's files wherever they are: its tensor
    files where `tensor_files` says (a step directory's, or a writer's RAM stage:
    training/ram_stage.py), its JSON files' text."""
    weights = load_file(tensor_files[WEIGHTS])
    state = _from_json(json.loads(texts[STATE_JSON]), load_file(tensor_files[STATE_TENSORS]))
    return weights, state, json.loads(texts[CONFIG])


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
