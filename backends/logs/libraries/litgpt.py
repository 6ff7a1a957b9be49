"""litgpt's pretrain and finetune lines: `Epoch 1 | iter 4 step 2 | loss train: 3.456, val:
n/a | iter time: …` at each optimizer step's last iteration, and after a validation `iter
10: val loss 3.2104, val time: …`.

The step is the one it names (`step 2`: optimizer steps; an iteration is a micro-batch, so
under gradient accumulation `iter` runs ahead). A validation names only its iteration: it
is dated at the step whose line named that iteration, and not read where none did. The
`val:` a step line repeats is the last validation's, not read again.
"""

from __future__ import annotations

import math
import re

_NUMBER = r"([-+]?\d{1,20}(?:\.\d{0,20})?(?:e[-+]?\d{1,4})?|nan|inf)"
_STEP = re.compile(r"(?:Epoch \d{1,9} \| )?iter (\d{1,12}) step (\d{1,12}) \| loss train: " + _NUMBER + ",")
_VALIDATION = re.compile(r"iter (\d{1,12}): val loss " + _NUMBER + ",")


class LitgptLog:
    """The iteration and step of the latest step line."""

    counts = "step"

    def __init__(self) -> None:
        self._at: tuple[int, int] | None = None  # (iteration, step)

    def read(self, text: str) -> tuple[int, dict] | bool:
        """A step and its loss, or a validation's loss at its step; True for a validation
        whose step was not named; False for a line not litgpt's."""
        if (m := _STEP.match(text)) is not None:
            self._at = int(m[1]), int(m[2])
            return self._at[1], _finite("loss", m[3])
        if (m := _VALIDATION.match(text)) is None:
            return False
        if self._at is None or self._at[0] != int(m[1]):
            return True
        return self._at[1], _finite("eval_loss", m[2])


def _finite(name: str, number: str) -> dict:
    value = float(number)
    return {name: value} if math.isfinite(value) else {}
