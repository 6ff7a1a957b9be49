"""timm's train.py log: `Train: 0 [   4/6 ( 83%)]  Loss: 0.222 (0.414)  Time: …` (the epoch
from 0, the update within it of the epoch's N, the loss now and the epoch's running mean)
and, after the epoch, `Test: [   1/1]  Time: … Loss:   0.337 ( 0.311)  Acc@1: …` (the batch
of its last, the batch's loss and the running mean).

What timm records for an epoch (its summary.csv) is the means at the epoch's last update
and its test's last batch: those are read, numbered by the epoch as printed; the lines
before them (a loss of one update or batch, whose step is not printed) are taken and not
read. `Test (EMA):` is a second evaluation, of the averaged weights: taken, not read. The
results JSON train.py prints at its end (`"loss": 0.087` of each epoch's sets) is taken
too, once a timm line was seen.
"""

from __future__ import annotations

import math
import re

_NUMBER = r"([-+]?\d{1,20}(?:\.\d{0,20})?(?:e[-+]?\d{1,4})?|nan|inf)"
_TRAIN = re.compile(
    r"Train: (\d{1,9}) \[\s{0,9}(\d{1,9})/(\d{1,9}) \(\s{0,3}\d{1,3}%\)\]\s{1,4}"
    r"Loss: " + _NUMBER + r" \(" + _NUMBER + r"\)"
)
_TEST = re.compile(
    r"Test( \(EMA\))?: \[\s{0,9}(\d{1,9})/(\d{1,9})\]\s{1,4}Time: \S{1,24} \(\S{1,24}\)\s{1,4}"
    r"Loss:\s{0,9}" + _NUMBER + r" \(\s{0,9}" + _NUMBER + r"\)"
)
_RESULTS = re.compile(r"\s{0,40}(?:[\[\]{}],?|\"\w{1,64}\": .{0,200})")  # a line of the results JSON


class TimmLog:
    """The epoch of the latest `Train:` line, once one was seen."""

    counts = "epoch"

    def __init__(self) -> None:
        self._epoch: int | None = None

    def read(self, text: str) -> tuple[int, dict] | bool:
        """An epoch's number and its mean loss (`loss`) or test loss (`eval_loss`); True for
        another of timm's lines (nothing to read there); False for a line not timm's."""
        if (m := _TRAIN.match(text)) is not None:
            self._epoch = int(m[1])
            last = int(m[2]) + 1 == int(m[3])
            return (self._epoch, _value("loss", m[5])) if last else True
        if self._epoch is None:
            return False
        if (m := _TEST.match(text)) is not None:
            last = m[1] is None and m[2] == m[3]
            return (self._epoch, _value("eval_loss", m[5])) if last else True
        return bool(_RESULTS.fullmatch(text))


def _value(name: str, number: str) -> dict:
    value = float(number)
    return {name: value} if math.isfinite(value) else {}
