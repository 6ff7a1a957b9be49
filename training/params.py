"""The trainer's parameters that a relaunch may change, named, typed and ranged once.

`trackside train`'s parser (training/cli.py) takes each of these flags with the range
written here, and `trackside relaunch --set` and the dashboard's edit form
(backends/params.py) check an edit against the same range: an edit accepted there is
never refused by the trainer it relaunches. Standard library only, as training/contract.py:
backends and the dashboard read it without torch.

Values are checked against a strict literal grammar before conversion (Python's `int()`
would accept surrounding whitespace, newlines and underscores), so nothing but a plain
number ever reaches an argv.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

_INT = re.compile(r"[0-9]{1,12}")
_FLOAT = re.compile(r"(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]{1,3})?")
_BOOL = {"true": True, "false": False}
_KIND_WORDS = {int: "a whole number in digits", float: "a number in digits (e.g. 3e-4)"}


class ParamError(ValueError):
    """A parameter is unknown, malformed or out of range; `key` names it, `reason` says
    what is wrong with it."""

    def __init__(self, key: str, reason: str):
        super().__init__(f"{key}: {reason}")
        self.key = key
        self.reason = reason


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
    drafter: str | None = None  # "eagle3" or "dflash": the one drafter that takes it; None: both
    # The trainer's value where the flag is not given (and, for a DFlash knob, the preset
    # gives none); None: another rule decides (training/cli.py).
    default: int | float | None = None

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
            if not isinstance(text, str) or text.strip().lower() not in _BOOL:
                raise ParamError(self.name, f"{text!r} is not true or false")
            return _BOOL[text.strip().lower()]
        grammar = _INT if self.kind is int else _FLOAT
        # A sign is read so that -5 is told its range, not that it is no number; the range
        # check then keeps every value the grammar lets through a plain literal.
        if not isinstance(text, str) or not grammar.fullmatch(text.removeprefix("-")):
            raise ParamError(self.name, f"{text!r} is not {_KIND_WORDS[self.kind]}")
        return self.check(self.kind(text))

    def check(self, value: int | float | bool) -> int | float | bool:
        if self.bare is not None and isinstance(value, bool):
            return count_recomputed(value)
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

    def argument_type(self, text: str) -> int | float:
        """The flag's value as the trainer's parser takes it: this param's grammar and
        range, told as argparse tells a bad value (naming the flag)."""
        try:
            return self.parse(text)
        except ParamError as e:
            raise argparse.ArgumentTypeError(e.reason) from None


# The deepest TTT unroll a run may ask for; a bare --checkpoint-ttt recomputes that many,
# which is every step of any run.
MAX_TTT_STEPS = 16


def count_recomputed(checkpoint_ttt: int | bool) -> int:
    """checkpoint_ttt as a count of TTT steps. Manifests and `start` events written while
    --checkpoint-ttt was a bool hold true (every step) or false (none)."""
    if isinstance(checkpoint_ttt, bool):
        return MAX_TTT_STEPS if checkpoint_ttt else 0
    return checkpoint_ttt


PARAMS: dict[str, Param] = {
    p.name: p
    for p in [
        Param("max_seq_len", int, 128, 1048576),
        Param("ttt_steps", int, 1, MAX_TTT_STEPS, drafter="eagle3", default=3),
        Param("ttt_decay", float, 0, 1, low_open=True, drafter="eagle3", default=0.8),
        # AdamW's rate: past 1 no drafter trains, it diverges in its first steps
        Param("lr", float, 0, 1, low_open=True),
        Param("steps", int, 1),
        Param("epochs", int, 1),
        Param("batch_rows", int, 1),
        Param("draft_vocab_size", int, 1, drafter="eagle3"),
        Param("loss_chunk", int, 1),
        Param("save_every", int, 0),
        Param("seed", int, 0),
        # the first N TTT steps recomputed (at most its ttt_steps: backends/params.py's
        # conflicts refuses more)
        Param("checkpoint_ttt", int, 0, MAX_TTT_STEPS, bare=MAX_TTT_STEPS, meaning="TTT steps recomputed", drafter="eagle3"),
        Param("freeze_lm_head", bool, drafter="eagle3"),
        # the layers' projections in fp8 (training/fp8.py): a relaunch on a card older than
        # Ada is refused by the trainer, naming the flag
        Param("fp8", bool),
        # DFlash's (trackside train --drafter dflash); the block and the anchors must also
        # fit a row of max_seq_len (anchor_room), which the trainer checks once it knows
        # both (backends/params.py's conflicts tells an edit the same). The default anchors
        # are at most the row's room.
        Param("block_size", int, 2, 1048576, meaning="the anchor and the tokens drafted with it", drafter="dflash"),
        Param("max_anchors", int, 1, 1048576, meaning="blocks drawn per packed row", drafter="dflash", default=512),
        Param("dflash_gamma", float, 0, None, low_open=True, drafter="dflash", default=7.0),
        Param("soft_kl", float, 0, 1, meaning="share of KL in the loss", drafter="dflash", default=0.0),
        Param("num_layers", int, 1, drafter="dflash"),
    ]
}
# Parameters a run takes one of: the trainer's parser refuses both.
EXCLUSIVE = (("steps", "epochs"),)


def anchor_room(max_seq_len: int, block_size: int) -> int:
    """The blocks of block_size a row of max_seq_len tokens can anchor: a block's last
    token lies in the row, so the last anchor is block_size - 1 from its end."""
    return max_seq_len - block_size + 1


def add_param_flag(parser, name: str, **kwargs) -> None:
    """The flag of PARAMS[name] on an argparse parser or group, with its grammar and range
    (what `trackside train` and `trackside fit` take): a bool is a bare flag, and a param
    that may be bare takes its bare value when given without one."""
    param = PARAMS[name]
    if param.kind is bool:
        parser.add_argument(param.flag, action="store_true", **kwargs)
    elif param.bare is not None:
        parser.add_argument(param.flag, type=param.argument_type, nargs="?", const=param.bare,
                            **kwargs)
    else:
        parser.add_argument(param.flag, type=param.argument_type, **kwargs)


def layer_list(text: str) -> tuple[int, ...]:
    """A flag's verifier layers a,b,… (train --target-layers, extract --layers): distinct
    numbers."""
    try:
        layers = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected layer numbers a,b,…, got {text!r}")
    if len(set(layers)) != len(layers):
        raise argparse.ArgumentTypeError(f"expected distinct layer numbers, got {text!r}")
    return layers


def flag_index(argv: Sequence[str], flag: str) -> tuple[int, bool] | None:
    """Where `flag` last occurs in argv, and whether it is the `--flag=value` form."""
    for i in range(len(argv) - 1, -1, -1):
        if argv[i] == flag:
            return i, False
        if argv[i].startswith(flag + "="):
            return i, True
    return None


def read_params(argv: Sequence[str]) -> dict[str, int | float | bool]:
    """The known parameters an argv sets; malformed ones raise ParamError."""
    values: dict[str, int | float | bool] = {}
    for param in PARAMS.values():
        found = flag_index(argv, param.flag)
        if found is None:
            continue
        i, joined = found
        if param.kind is bool:
            if joined:
                raise ParamError(param.name, f"{param.flag} takes no value")
            values[param.name] = True
            continue
        if param.bare is not None and not joined and not has_value(argv, i):
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


def has_value(argv: Sequence[str], i: int) -> bool:
    return i + 1 < len(argv) and not argv[i + 1].startswith("--")
