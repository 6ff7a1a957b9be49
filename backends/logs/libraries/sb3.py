"""stable-baselines3's record, as backends.logs.boxes folds its box into one line
(`time/total_timesteps=1536 train/loss=41.6 train/n_updates=10 …`): its loss is at the
box's `train/n_updates`, the updates its `train()` has applied so far, labelled as such
and kept as printed (a PPO update is one of its `n_epochs` passes over a rollout, not an
optimizer step: the axis says n_updates). The same record in its logger's CSV pairs the
two. A box with no `train/` section (the first rollout's) is no point.
"""

from __future__ import annotations

import math
import re

_UPDATES = re.compile(r"(?:^| )train/n_updates=(\d{1,12})(?= |$)")
_LOSS = re.compile(r"(?:^| )train/loss=([-+]?\d{1,20}(?:\.\d{0,20})?(?:e[-+]?\d{1,4})?|nan|inf)(?= |$)")


class Sb3Log:
    """A box's record; nothing to keep between them."""

    counts = "n_updates"

    def read(self, text: str) -> tuple[int, dict] | bool:
        """The updates so far and the loss of the last; False for a line naming no both."""
        if (updates := _UPDATES.search(text)) is None or (loss := _LOSS.search(text)) is None:
            return False
        value = float(loss[1])
        return int(updates[1]), {"loss": value} if math.isfinite(value) else {}
