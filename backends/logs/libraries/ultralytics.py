"""ultralytics' training console: under a header `Epoch GPU_mem box_loss cls_loss dfl_loss
Instances Size`, an epoch's bar whose first cells are the epoch of the run's and the memory
(`1/3  0G  0.8073  0.7242  0.4969  4  64: 100% ━━━ 8/8`), then the validation's bar
(`Class Images Instances Box(P R mAP50 mAP50-95): 100% ━━━ 1/1`) and its rows.

The epoch is read as printed (from 1, as its results.csv numbers it), and is the step. Its
losses are not: three (box, classification, distribution focal), no total, and at 80
columns the bar cuts its description short (`0.8073  0.72…`); the validation prints no
loss. Every line of these, once the header was seen, is taken here and not read as anything
else (the validation bar is not the training loop's, its `1/1` no step).
"""

from __future__ import annotations

import re

_HEADER = re.compile(r"\s{0,40}Epoch\s{1,20}GPU_mem\s{1,20}\w{0,40}loss\b.{0,200}")
_EPOCH = re.compile(r"\s{0,40}(\d{1,9})/(\d{1,9})\s{1,40}\d{1,9}(?:\.\d{1,9})?G\s")
_VALIDATION = re.compile(r"\s{0,40}(?:Class\s{1,20}Images\b|all\s{1,20}\d)")


class UltralyticsLog:
    """Whether the epoch header was seen: the lines below it are ultralytics'."""

    counts = "epoch"

    def __init__(self) -> None:
        self._seen = False

    def read(self, text: str) -> tuple[int, dict] | bool:
        """An epoch bar's epoch (no losses); True for the header or the validation's lines;
        False for a line not ultralytics'."""
        if _HEADER.fullmatch(text):
            self._seen = True
            return True
        if not self._seen:
            return False
        if (m := _EPOCH.match(text)) is not None and int(m[1]) <= int(m[2]):
            return int(m[1]), {}
        return _VALIDATION.match(text) is not None
