"""scikit-learn's MLPClassifier/MLPRegressor with verbose=True (the stochastic solvers, sgd
and adam): `Iteration 30, loss = 0.62071366`, a line a pass over the data, its loss to eight
decimals. scikit-learn's `max_iter` counts these passes as epochs: the number is the run's,
as printed (from 1), and the axis says epoch, not step. Only that exact shape (eight
decimals, as sklearn formats it) is taken: another loop's `Iteration 30, loss = 0.62` is a
step, read by the generic parsers.
"""

from __future__ import annotations

import re

_LINE = re.compile(r"Iteration (\d{1,9}), loss = (\d{1,20}\.\d{8})")


class SklearnLog:
    """sklearn's per-epoch line; nothing to keep between lines."""

    counts = "epoch"

    def read(self, text: str) -> tuple[int, dict] | bool:
        """The epoch and its loss; False for any other line."""
        if (m := _LINE.fullmatch(text.strip())) is None:
            return False
        return int(m[1]), {"loss": float(m[2])}
