"""The launch parameters a relaunch may change, and their place in a trainer argv.

Their names, kinds and ranges are the trainer's own table (training/params.py), which
`trackside train`'s parser reads too; this module checks edits against it and writes
them into an argv.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from training.params import EXCLUSIVE, PARAMS, Param, ParamError, anchor_room, count_recomputed, flag_index, has_value, read_params as read

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


def check(params: dict) -> dict[str, int | float | None]:
    """Validate an already-typed mapping (a manifest's params, an API caller's changes);
    None stays None: an edit that clears a parameter, whose flag a relaunch leaves out."""
    return {key: None if value is None else _param(key).check(value) for key, value in params.items()}


def drafter_of(argv: Sequence[str]) -> str:
    """The drafter a trainer argv trains: `--drafter dflash`, else EAGLE-3."""
    found = flag_index(argv, "--drafter")
    if found is None:
        return "eagle3"
    i, joined = found
    value = argv[i].split("=", 1)[1] if joined else (argv[i + 1] if i + 1 < len(argv) else "")
    return "dflash" if value == "dflash" else "eagle3"


DRAFTER_NAMES = {"eagle3": "EAGLE-3", "dflash": "DFlash"}


def conflicts(params: dict, drafter: str = "eagle3") -> list[ParamError]:
    """What the trainer refuses in params each valid alone: two that exclude each other
    (steps and epochs), another drafter's parameter, more TTT steps recomputed than taken,
    and for DFlash a block longer than a row of max_seq_len or more anchors than such a
    row has room for (max_seq_len − block_size + 1). `params`: what the run will train
    with, max_anchors only where its argv sets it (the trainer fits a preset's to the row)."""
    for pair in EXCLUSIVE:
        if all(params.get(name) is not None for name in pair):
            return [ParamError(pair[1], f"not with {pair[0]}: a run is given one or the other (clear {pair[0]} to set it)")]
    for name, value in params.items():
        owner = PARAMS[name].drafter if name in PARAMS else None
        if value is not None and owner is not None and owner != drafter:
            return [ParamError(name, f"{DRAFTER_NAMES[owner]}'s; this run trains {DRAFTER_NAMES[drafter]}")]
    recomputed, ttt = params.get("checkpoint_ttt"), params.get("ttt_steps")
    if recomputed and ttt is not None and count_recomputed(recomputed) > ttt and recomputed != PARAMS["checkpoint_ttt"].bare:
        return [ParamError("checkpoint_ttt", f"must be ≤ ttt_steps {ttt} (got {recomputed})")]
    length, block = params.get("max_seq_len"), params.get("block_size")
    if length is None:
        return []
    if block is not None and block > length:
        return [ParamError("block_size", f"must be ≤ max_seq_len {_shown(length)} (got {_shown(block)})")]
    room = anchor_room(length, block) if block is not None else length
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
    removed at 0; a parameter set to None is removed."""
    argv = list(argv)
    for key, value in check(params).items():
        param = PARAMS[key]
        flag = param.flag
        if value is None:
            argv = _without(argv, param)  # cleared: the trainer's default
        elif isinstance(value, bool):
            argv = _without(argv, param) + ([flag] if value else [])
        elif param.bare is not None:
            argv = _without(argv, param) + ([flag, str(value)] if value else [])
        else:
            argv = set_flag(argv, flag, repr(value) if isinstance(value, float) else str(value))
    return argv


def edited(argv: Sequence[str], params: dict, changes: dict) -> tuple[list[str], dict]:
    """A relaunch's argv and params: a run's (`argv`, `params`) with `changes` applied (a
    None clears one), refused with ParamError, before anything starts, where the trainer
    would refuse it (a child dying in its first seconds is past the moment a launch is
    judged)."""
    merged = {**params, **check(changes)}
    errors = conflicts(merged, drafter_of(argv))
    if errors:
        raise errors[0]
    return apply([a for a in argv if a != "--resume"], merged), {k: v for k, v in merged.items() if v is not None}
