"""A record printed as a box, a row a value, between rules of dashes: stable-baselines3's
logger (`| train/ | |` heads a section, `|    loss | 48.2 |` a value in it). Its rows are
read as one `section/key=value` line (backends.logs.logparse names its losses: `train/loss` is
the run's, `train/value_loss` one of its parts)."""

from __future__ import annotations

import re

_RULE = re.compile(r"-{3,400}")
_ROW = re.compile(r"\|\s{0,80}([^\s|]{1,64})\s{0,80}\|\s{0,80}([^\s|]{0,64})\s{0,80}\|")
_ROWS = 128  # a box's rows read at most: sb3 prints a few dozen


class Box:
    """Lines in; a box's rows out as one line once its closing rule comes."""

    def __init__(self) -> None:
        self._rows: list[str] | None = None  # the open box's `key=value`s
        self._section = ""

    def read(self, text: str) -> tuple[bool, str | None]:
        """Whether `text` belongs to a box (then it is not read alone), and the record a
        closing rule completes."""
        if _RULE.fullmatch(text):
            if self._rows:
                rows, self._rows = self._rows, None
                return True, " ".join(rows)
            self._rows, self._section = [], ""
            return True, None
        if self._rows is None:
            return False, None
        row = _ROW.fullmatch(text)
        if row is None:
            self._rows = None  # no box after all
            return False, None
        name, value = row[1], row[2]
        if name.endswith("/") and not value:
            self._section = name
        elif value and len(self._rows) < _ROWS:
            self._rows.append(f"{self._section}{name}={value}")
        return True, None
