"""Which of a console's bars counts the training loop: told by its shape and by what comes
with it, never by the bar nearest a loss.

A console draws many bars: datasets' `Map: 2000/2000` before training, a download, an
evaluation's, the training loop's. The training loop's is the one whose label says training
or an epoch, a counter labelled as steps (`Step 12/500`, Megatron's `iteration 10/ 100`), a
bar whose postfix carries the loss, or the bare bar under way when a loss is printed (HF
Trainer writes its log dicts above its bar), or drawn next after one; from then on that
bar (its label's shape and its total) only. A bar of another label, or one under way while
no loss comes, counts something else: its count is progress, never a step.
"""

from __future__ import annotations

import re

from backends.logs.logparse import Progress

# Bars that count something other than training steps, whatever their phase says.
# (ultralytics' `train: Scanning … 32/32` counts its files)
NOT_TRAINING = re.compile(r"eval|valid|test|predict|generat|sanity|scanning", re.IGNORECASE)
# A label that is the training loop's name, not one that mentions it (TRL's `Tokenizing train
# dataset` is a data pass): `Training`, `train`, `Train steps`; an epoch is read apart.
_TRAINING_LABEL = re.compile(r"train(?:ing)?(?:[ _-](?:steps?|loop|iters?|iterations?))?", re.IGNORECASE)
_STEP_LABEL = re.compile(r"(?:global[ _])?(?:step|iter|iteration)s?", re.IGNORECASE)
_DIGITS = re.compile(r"\d+")


def _shape(bar: Progress) -> tuple[str, int]:
    """A bar as the same bar redrawn, or the next epoch's: its label, numbers blanked, and total."""
    return _DIGITS.sub("#", bar.label), bar.total


class TrainingBar:
    """The bars and loss lines of one console, in order: which bar is the training loop's."""

    def __init__(self) -> None:
        self._known: tuple[str, int] | None = None
        self._loss_since_bar = False  # a training loss was printed since the last bar was drawn
        self._candidate: Progress | None = None  # the latest bare bar, while the training's is not known

    def drawn(self, bar: Progress, postfix_loss: bool) -> bool:
        """A bar drawn (`postfix_loss`: its postfix shows a training loss); whether it counts
        the training loop."""
        after_loss, self._loss_since_bar = self._loss_since_bar, False
        if bar.phase not in ("training", "working") or NOT_TRAINING.search(bar.label):
            return False
        if bar.kind == "counter":
            return bool(_STEP_LABEL.fullmatch(bar.label))
        if bar.kind in ("keras", "rich") or bar.epoch is not None or _TRAINING_LABEL.fullmatch(bar.label):
            return True
        if _shape(bar) == self._known:
            return True
        if postfix_loss or (not bar.label and after_loss and self._known is None):
            self._known = _shape(bar)
            return True
        if not bar.label and bar.kind == "tqdm":
            self._candidate = bar
        return False

    def loss_printed(self) -> Progress | None:
        """A training loss printed on a line of its own; the bar it shows to be the training
        loop's, if one was under way (its count is then a step), else None. A bar already
        at its end when the loss comes (a data pass's) is not."""
        self._loss_since_bar = True
        bar, self._candidate = self._candidate, None
        if self._known is not None or bar is None or bar.done >= bar.total:
            return None
        self._known = _shape(bar)
        return bar
