"""torchtune's recipes' bar: tqdm, a bar an epoch, its description `2|14|Loss: 2.8415…`
(the epoch from 1, the optimizer step over the run from 1, that step's loss, as its metric
logger records them, gradient accumulation or not).

The step and loss are read from the description, never from the bar's count (the epoch's
steps, `4/10`) or total (one epoch's, not the run's).
"""

from __future__ import annotations

import math
import re

_DESCRIPTION = re.compile(r"\s{0,40}(\d{1,9})\|(\d{1,9})\|Loss: ([-+]?\d{1,20}(?:\.\d{0,20})?(?:e[-+]?\d{1,4})?|nan|inf)")


class TorchtuneLog:
    """torchtune's bar description; nothing to keep between lines."""

    counts = "step"

    def read(self, text: str) -> tuple[int, dict] | bool:
        """The step and its loss; False for a line not its bar's."""
        if (m := _DESCRIPTION.match(text)) is None:
            return False
        value = float(m[3])
        return (int(m[2]), {"loss": value} if math.isfinite(value) else {})
