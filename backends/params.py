"""The launch parameters a relaunch may change, and their place in a trainer argv.

Their names, kinds and ranges are the trainer's own table (training/params.py), which
`trackside train`'s parser reads too; this module checks edits against it and writes
them into an argv.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from training.params import PARAMS, Param, ParamError, flag_index, has_value, read_params as read

__all__ = ["PARAMS", "Param", "ParamError", "apply", "check", "conflicts", "parse_sets", "read", "set_flag"]

_KEY = re.compile(r"[a-z][a-z0-9_]*")


def _param(key: str) -> Param:
    if not _KEY.fullmatch(key) or key not in PARAMS:
        raise ParamError(key, f"unknown parameter (known: {', '.join(PARAMS)})")
    return PARAMS[key]


def parse_sets(items: Iterable[str]) -> dict[str, int | float]:
    """`["max_seq_len=16384", "ttt_steps=5"]` -> typed, range-checked values."""
    values: dict[str, int | float] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep:
            raise ParamError(key or item, "expected key=value")
        values[key] = _param(key).parse(text)
    return values


def check(params: dict) -> dict[str, int | float]:
    """Validate an already-typed mapping (a manifest's params, an API caller's changes)."""
    return {key: _param(key).check(value) for key, value in params.items()}


def conflicts(params: dict) -> list[ParamError]:
    """What a DFlash trainer refuses in params each valid alone: a block longer than a row
    of max_seq_len, or more anchors than such a row has room for (max_seq_len − block_size
    + 1). `params`: what the run will train with, max_anchors only where its argv sets it
    (the trainer fits a preset's to the row)."""
    length, block = params.get("max_seq_len"), params.get("block_size")
    if length is None:
        return []
    if block is not None and block > length:
        return [ParamError("block_size", f"must be ≤ max_seq_len {_shown(length)} (got {_shown(block)})")]
    room = length - block + 1 if block is not None else length
    anchors = params.get("max_anchors")
    if anchors is not None and anchors > room:
        blocks = f"the blocks of {block}" if block is not None else "the positions"
        return [ParamError("max_anchors", f"must be ≤ {_shown(room)}, {blocks} a row of max_seq_len "
                                          f"{_shown(length)} holds (got {_shown(anchors)})")]
    return []


def _shown(count: int) -> str:
    return f"{int(count):,}"


def _without(argv: Sequence[str], param: Param) -> list[str]:
    """argv with every occurrence of the param's flag removed, with its value if given."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] == param.flag:
            i += 2 if param.kind is not bool and has_value(argv, i) else 1
            continue
        if not argv[i].startswith(param.flag + "="):
            out.append(argv[i])
        i += 1
    return out


def set_flag(argv: Sequence[str], flag: str, value: str) -> list[str]:
    """argv with `flag value` replaced where present, else appended."""
    argv = list(argv)
    found = flag_index(argv, flag)
    if found is None:
        return argv + [flag, value]
    i, joined = found
    if joined:
        argv[i] = f"{flag}={value}"
    elif i + 1 < len(argv):
        argv[i + 1] = value
    else:
        argv.append(value)
    return argv


def apply(argv: Sequence[str], params: dict) -> list[str]:
    """A trainer argv with each parameter set to its (validated) value; a bool flag is
    added when true, and every occurrence removed when false; a flag that may be bare is
    removed at 0."""
    argv = list(argv)
    for key, value in check(params).items():
        param = PARAMS[key]
        flag = param.flag
        if isinstance(value, bool):
            argv = _without(argv, param) + ([flag] if value else [])
        elif param.bare is not None:
            argv = _without(argv, param) + ([flag, str(value)] if value else [])
        else:
            argv = set_flag(argv, flag, repr(value) if isinstance(value, float) else str(value))
    return argv
