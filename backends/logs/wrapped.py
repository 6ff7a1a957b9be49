"""A record a logger wrapped over several lines, joined again before it is read: Rich's log
handler prints `key=value,` pairs, ends a line at the terminal's width after a comma,
indents the rest of the record 20 columns, and puts the source location (`trainer.py:120`)
at each line's right.
"""

from __future__ import annotations

import re

INDENT = " " * 16  # a wrapped record's later lines (Rich indents them 20)
_SOURCE = re.compile(r"\s+[\w.-]{1,64}\.py:\d{1,9}\s*$")
_SOURCE_TAIL = 160  # where it can stand: the pattern is tried there only (a long run of blanks backtracks)


def unsourced(text: str) -> str:
    """The line without the source location Rich's log handler puts at its right."""
    m = _SOURCE.search(text, max(0, len(text) - _SOURCE_TAIL))
    return text if m is None else text[: m.start()]


class Wrapped:
    """Lines in; whole records out, each once its last line has come."""

    def __init__(self) -> None:
        self._held: str | None = None  # a wrapped record's lines so far

    def read(self, text: str) -> tuple[list[str], str | None]:
        """The records `text` completes, and `text` itself when it neither starts a record
        nor continues one (then it is a line of its own)."""
        done: list[str] = []
        if self._held is not None:
            if text.startswith(INDENT) and text.strip():
                self._held += " " + unsourced(text).strip()
                if self._held.endswith(","):
                    return done, None
                text = ""
            done.append(self._held)
            self._held = None
            if not text:
                return done, None
        if unsourced(text).endswith(","):
            self._held = unsourced(text)
            return done, None
        return done, text

    def flush(self) -> list[str]:
        """Nothing more is coming: a record still held is whole."""
        held, self._held = self._held, None
        return [] if held is None else [held]
