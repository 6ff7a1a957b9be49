"""A flag's number, held to the range of the setting it gives (backends/ranges.py): argparse's
`type=` for `--grace`, `--interval`, `--port`, …, its error naming the flag (exit 2)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from backends.ranges import Bounds


def bounded(bounds: Bounds) -> Callable[[str], int | float]:
    def parse(text: str) -> int | float:
        try:
            return bounds.check(bounds.kind(text))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{bounds.expected}, got {text!r}") from None

    return parse
