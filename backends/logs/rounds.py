"""A boosting round's line: LightGBM's `[5]\tvalid_0's binary_logloss: 0.44` and XGBoost's
`[0]\ttrain-logloss:0.51\teval-logloss:0.52`, one value per evaluated set and metric.

The number in brackets is the library's own round (LightGBM's from 1, XGBoost's from 0),
kept as printed. Which set a value is of is read from the set's name only where the library
or the user named it for what it is: LightGBM calls the training data `training` (whatever
else it was passed as) and numbers the rest `valid_N`; xgboost.train prints the names it
was given (`train`, `eval`). XGBoost's scikit-learn API calls every set `validation_N`,
the training data among them when it is passed there: such a set is neither, and is not
read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# The round, then `set's metric: value` (LightGBM) or `set-metric:value` (XGBoost), each
# followed by a tab (spaces once a terminal drew it).
_ROUND = re.compile(r"\[(\d{1,18})\]\s{1,16}")
_VALUE = r"([-+]?\d{1,20}(?:\.\d{0,20})?(?:e[-+]?\d{1,4})?)(?:\s{1,16}|$)"
_LIGHTGBM = re.compile(r"([\w.-]{1,64})'s ([\w@.-]{1,64}): " + _VALUE)
_XGBOOST = re.compile(r"([\w.]{1,64})-([\w@.-]{1,64}):" + _VALUE)
TRAINING_SETS = frozenset({"training", "train"})
_EVAL_SET = re.compile(r"valid_\d{1,9}|valid|val|eval|test|validation")
_LOSS_METRIC = re.compile(r".{0,60}loss")  # logloss, binary_logloss, multi_logloss, mlogloss


@dataclass(frozen=True)
class Round:
    number: int
    loss: float | None  # the training set's loss metric, where a set is named as training
    eval_loss: float | None  # the first validation set's


def parse_round(text: str) -> Round | None:
    """A boosting round's line → its round and losses, or None if it is not one."""
    m = _ROUND.match(text)
    if m is None:
        return None
    loss = eval_loss = None
    at, end = m.end(), len(text.rstrip())
    while at < end:
        value = _LIGHTGBM.match(text, at) or _XGBOOST.match(text, at)
        if value is None:
            return None  # something else in brackets
        at = value.end()
        name, metric, number = value[1], value[2], float(value[3])
        if not _LOSS_METRIC.fullmatch(metric):
            continue
        if name in TRAINING_SETS:
            loss = number if loss is None else loss
        elif _EVAL_SET.fullmatch(name) and eval_loss is None:
            eval_loss = number
    return Round(int(m[1]), loss, eval_loss)
