"""The typed launch parameters a relaunch may change, and their place in a trainer argv.

Values are checked against a strict literal grammar before conversion (Python's `int()`
would accept surrounding whitespace, newlines and underscores), so nothing but a plain
number ever reaches an argv.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

_INT = re.compile(r"[0-9]{1,12}")
_FLOAT = re.compile(r"(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]{1,3})?")
_KEY = re.compile(r"[a-z][a-z0-9_]*")


class ParamError(ValueError):
    """A parameter is unknown, malformed or out of range; `key` names it."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key = key


_BOOL = {"true": True, "false": False}


@dataclass(frozen=True)
class Param:
    name: str
    kind: type  # int, float, or bool (a bare flag: present is true)
    low: float | None = None
    high: float | None = None
    low_open: bool = False  # low itself excluded, as in (0, 1]
    # An int flag that may also be given bare stands for this value then, and is left
    # out of the argv at 0.
    bare: int | None = None
    meaning: str | None = None  # what the number counts, where its name does not say

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def shown(self, value: float) -> str:
        """A value as the operator reads it: 1,048,576 for an int, 0.0003 for a float."""
        return f"{int(value):,}" if self.kind is int else f"{value:g}"

    @property
    def _low(self) -> str | None:
        return None if self.low is None else f"{'>' if self.low_open else '≥'} {self.shown(self.low)}"

    @property
    def _high(self) -> str | None:
        return None if self.high is None else f"≤ {self.shown(self.high)}"

    def describe(self) -> str:
        if self.kind is bool:
            return "bool: true or false"
        text = f"{self.kind.__name__} {' and '.join(filter(None, [self._low, self._high]))}".strip()
        return f"{text}: {self.meaning}" if self.meaning else text

    def parse(self, text: str) -> int | float | bool:
        if self.kind is bool:
            if text not in _BOOL:
                raise ParamError(self.name, f"{text!r} is not true or false")
            return _BOOL[text]
        grammar = _INT if self.kind is int else _FLOAT
        # A sign is read so that -5 is told its range, not that it is no number; the range
        # check then keeps every value the grammar lets through a plain literal.
        if not isinstance(text, str) or not grammar.fullmatch(text.removeprefix("-")):
            raise ParamError(self.name, f"{text!r} is not {_KIND_WORDS[self.kind]}")
        return self.check(self.kind(text))

    def check(self, value: int | float | bool) -> int | float | bool:
        if self.bare is not None and isinstance(value, bool):
            # as manifests wrote it while the flag was a bool: bare, or left out
            return self.bare if value else 0
        if self.kind is bool:
            if not isinstance(value, bool):
                raise ParamError(self.name, f"{value!r} is not true or false")
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ParamError(self.name, f"{value!r} is not a number")
        if self.kind is int and not float(value).is_integer():
            raise ParamError(self.name, f"{value!r} is not a whole number")
        value = self.kind(value)
        if not math.isfinite(value):
            raise ParamError(self.name, f"{value!r} is not finite")
        too_low = self.low is not None and (value <= self.low if self.low_open else value < self.low)
        too_high = self.high is not None and value > self.high
        if too_low or too_high:
            raise ParamError(self.name, f"must be {self._low if too_low else self._high} (got {self.shown(value)})")
        return value


_KIND_WORDS = {int: "a whole number in digits", float: "a number in digits (e.g. 3e-4)"}


PARAMS: dict[str, Param] = {
    p.name: p
    for p in [
        Param("max_seq_len", int, 128, 1048576),
        Param("ttt_steps", int, 1, 16),
        Param("ttt_decay", float, 0, 1, low_open=True),
        Param("lr", float, 0, None, low_open=True),
        Param("steps", int, 1),
        Param("epochs", int, 1),
        Param("batch_rows", int, 1),
        Param("draft_vocab_size", int, 1),
        Param("loss_chunk", int, 1),
        Param("save_every", int, 0),
        Param("seed", int, 0),
        # the first N TTT steps recomputed; bare, every step (the trainer takes at most
        # its ttt_steps, at most 16 here)
        Param("checkpoint_ttt", int, 0, 16, bare=16,
              meaning="TTT steps recomputed"),
        Param("freeze_lm_head", bool),
        # DFlash's (trackside train --drafter dflash), as its trainer checks them; the
        # block and the anchors must also fit a row of max_seq_len (see conflicts).
        Param("block_size", int, 2, 1048576, meaning="the anchor and the tokens drafted with it"),
        Param("max_anchors", int, 1, 1048576, meaning="blocks drawn per packed row"),
        Param("dflash_gamma", float, 0, None, low_open=True),
        Param("soft_kl", float, 0, 1, meaning="share of KL in the loss"),
        Param("num_layers", int, 1),
    ]
}


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


def _flag_index(argv: Sequence[str], flag: str) -> tuple[int, bool] | None:
    """Where `flag` last occurs in argv, and whether it is the `--flag=value` form."""
    for i in range(len(argv) - 1, -1, -1):
        if argv[i] == flag:
            return i, False
        if argv[i].startswith(flag + "="):
            return i, True
    return None


def read(argv: Sequence[str]) -> dict[str, int | float | bool]:
    """The known parameters an argv sets; malformed ones raise ParamError."""
    values: dict[str, int | float | bool] = {}
    for param in PARAMS.values():
        found = _flag_index(argv, param.flag)
        if found is None:
            continue
        i, joined = found
        if param.kind is bool:
            if joined:
                raise ParamError(param.name, f"{param.flag} takes no value")
            values[param.name] = True
            continue
        if param.bare is not None and not joined and not _has_value(argv, i):
            values[param.name] = param.bare
            continue
        if joined:
            text = argv[i].split("=", 1)[1]
        elif i + 1 < len(argv):
            text = argv[i + 1]
        else:
            raise ParamError(param.name, f"{param.flag} has no value")
        values[param.name] = param.parse(text)
    return values


def _has_value(argv: Sequence[str], i: int) -> bool:
    return i + 1 < len(argv) and not argv[i + 1].startswith("--")


def _without(argv: Sequence[str], param: Param) -> list[str]:
    """argv with every occurrence of the param's flag removed, with its value if given."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] == param.flag:
            i += 2 if param.kind is not bool and _has_value(argv, i) else 1
            continue
        if not argv[i].startswith(param.flag + "="):
            out.append(argv[i])
        i += 1
    return out


def set_flag(argv: Sequence[str], flag: str, value: str) -> list[str]:
    """argv with `flag value` replaced where present, else appended."""
    argv = list(argv)
    found = _flag_index(argv, flag)
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
