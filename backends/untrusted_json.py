"""JSON that anyone may have written (metrics.jsonl lines, manifests): read so that no value
in it can be a number no view can show or reckon with.

Python's json reads NaN, Infinity and -Infinity, and turns 1e400 into inf; an integer of
thousands of digits is read whole and overflows the first float() it meets. Here each of
those reads as absent (None), as a field the writer left out would, and nesting deeper than
the interpreter's stack is not JSON (ValueError, like any other text that is not).
"""

from __future__ import annotations

import json
import math
from typing import Any

# Wider than any step, PID, byte count or exit status; narrower than what overflows a float.
LARGEST_INT = 2**63 - 1
_INT_DIGITS = len(str(LARGEST_INT)) + 1  # with a sign: longer text is out of range unread


def _absent(_constant: str) -> None:
    return None


def _float(text: str) -> float | None:
    value = float(text)
    return value if math.isfinite(value) else None


def _int(text: str) -> int | None:
    if len(text) > _INT_DIGITS:
        return None  # int() of thousands of digits is refused, and slow before that
    value = int(text)
    return value if -LARGEST_INT <= value <= LARGEST_INT else None


def loads(text: str) -> Any:
    """The value `text` holds; ValueError if it holds none."""
    try:
        return json.loads(text, parse_constant=_absent, parse_float=_float, parse_int=_int)
    except RecursionError:
        raise ValueError("nested too deeply") from None
