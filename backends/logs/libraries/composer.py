"""MosaicML Composer's ConsoleLogger (`log_to_console=True`): a heading
`[epoch=1][batch=2/8]:` (the epoch from 1, the batch of the epoch's, from 1), printed on
the row its progress bar was drawn on, then a line a metric, `Train loss/train/total:
1.4112`; after an evaluation `Eval metrics/eval/CrossEntropy: 1.2713`.

The step is the batch counted over the run, as Composer's timestamp has it once the batch
is done: (epoch - 1) × batches an epoch + batch. `loss/train/total` is the training loss;
an evaluation's `CrossEntropy` its loss, at the last step trained. The other metric lines
(`Train time/batch: 1`, accuracies) are taken, not read: `time/batch` counts from 0 and is
no step, an accuracy no loss.
"""

from __future__ import annotations

import math
import re

_HEADING = re.compile(r"\[epoch=(\d{1,9})\]\[batch=(\d{1,9})/(\d{1,9})\]:")
_METRIC = re.compile(
    r"\s{0,40}(Train|Eval) ([\w/.@-]{1,128}): ([-+]?\d{1,20}(?:\.\d{0,20})?(?:e[-+]?\d{1,4})?|nan|inf)\s{0,40}"
)
_LOSSES = {("Train", "loss/train/total"): "loss", ("Eval", "metrics/eval/CrossEntropy"): "eval_loss"}


class ComposerLog:
    """The step of the latest heading, once one was seen."""

    counts = "step"

    def __init__(self) -> None:
        self._step: int | None = None

    def read(self, text: str) -> tuple[int, dict] | bool:
        """A loss and its step; True for another of the logger's lines; False for a line
        not its."""
        if "[epoch=" in text and (m := _HEADING.search(text)) is not None:
            epoch, batch, batches = int(m[1]), int(m[2]), int(m[3])
            self._step = (epoch - 1) * batches + batch if epoch >= 1 and batch <= batches else None
            return True
        if self._step is None or (m := _METRIC.fullmatch(text)) is None:
            return False
        name, value = _LOSSES.get((m[1], m[2])), float(m[3])
        return (self._step, {name: value}) if name is not None and math.isfinite(value) else True
