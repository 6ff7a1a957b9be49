"""A table printed a row an epoch under a header of column names: skorch's PrintLog
(`  epoch    train_loss    valid_acc    valid_loss     dur`, a rule of dashes, then rows)
and fastai's (`epoch     train_loss  valid_loss  accuracy  time`). The first column counts
the rows (an epoch, a step), kept as printed; a row's losses are read by their columns'
names, as a `name=value` line would be (backends.logs.logparse).
"""

from __future__ import annotations

import re

from backends.logs.logparse import parse_console_line

_NAME = re.compile(r"[A-Za-z_][\w/.@-]{0,63}")
_COUNTERS = frozenset({"epoch", "step", "iter", "iteration"})
_RULE = re.compile(r"[\s-]+")  # with a dash in it (one pattern of two stars backtracks)
_NUMBER = re.compile(r"[-+]?(?:\d{1,20}(?:\.\d{0,20})?|\.\d{1,20})(?:e[-+]?\d{1,4})?", re.IGNORECASE)
_MAX_COLUMNS = 32


class Table:
    """The latest table's header; its rows read as they come."""

    def __init__(self) -> None:
        self.counts: str | None = None  # the first column's name: what a row's number counts
        self._columns: list[str] = []

    def read(self, text: str) -> tuple[int, dict] | bool:
        """A row's count and fields (with `loss`, `eval_loss` as logparse names them); True
        for the header or its rule (nothing else to read there); False for another line."""
        cells = text.split(None, _MAX_COLUMNS + 1)
        if not cells or len(cells) > _MAX_COLUMNS:
            return False
        if 2 <= len(cells) and cells[0].lower() in _COUNTERS and all(_NAME.fullmatch(c) for c in cells):
            if any("loss" in c.lower() for c in cells):
                self.counts, self._columns = cells[0].lower(), [c.lower() for c in cells]
                return True
            return False
        if self._columns and "-" in text and _RULE.fullmatch(text):
            return True
        if len(cells) != len(self._columns) or not cells[0].isdigit() or len(cells[0]) > 18:
            return False
        pairs = [f"{name}={cell}" for name, cell in zip(self._columns[1:], cells[1:]) if _NUMBER.fullmatch(cell)]
        fields = parse_console_line(" ".join(pairs)) if pairs else None
        return (int(cells[0]), fields) if fields is not None else False
