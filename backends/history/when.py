"""`--at TIME`: a moment of a run's life, as an operator says it.

- `+DURATION`: after the run's start (`+30m`, `+1h30m`, `+90s`, `+2d`);
- `-DURATION`: before its end (its last record: now for a run still going when read);
- `HH:MM[:SS]`: that time of day on this machine's clock, on the day of the run's life
  it falls in (the first, for a run longer than a day);
- `YYYY-MM-DD HH:MM[:SS]` or `YYYY-MM-DDTHH:MM[:SS]`, local, or UTC with a `Z`;
- `start`, `end`.

A moment outside the run's life is refused, naming its start and end.
"""

from __future__ import annotations

import calendar
import re
import time

from training.contract import UsageError

_DURATION = re.compile(r"(?:(\d{1,6})d)?(?:(\d{1,7})h)?(?:(\d{1,9})m)?(?:(\d{1,11})s)?")
_CLOCK = re.compile(r"(\d{1,2}):(\d{2})(?::(\d{2}))?")
_DATE = re.compile(r"(\d{4})-(\d{2})-(\d{2})[ T](\d{1,2}):(\d{2})(?::(\d{2}))?(Z?)")
DAY_S = 86400.0


class WhenError(UsageError):
    """A --at that is no time, or none in the run's life."""


def stamp(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def duration(text: str) -> float | None:
    """`1h30m` in seconds; None where it is no duration."""
    match = _DURATION.fullmatch(text)
    if not text or match is None:
        return None
    d, h, m, s = (int(g or 0) for g in match.groups())
    return d * DAY_S + h * 3600.0 + m * 60.0 + s


def parse_when(text: str, start: float, end: float) -> float:
    """The moment `text` names in a life from `start` to `end` (epoch seconds)."""
    text = text.strip()
    life = f"its life runs from {stamp(start)} to {stamp(end)}"
    if text in ("start", "end"):
        return start if text == "start" else end
    if text[:1] in "+-" and (seconds := duration(text[1:])) is not None:
        when = start + seconds if text[0] == "+" else end - seconds
    elif match := _DATE.fullmatch(text):
        y, mo, d, h, mi, s, utc = match.groups()
        fields = (int(y), int(mo), int(d), int(h), int(mi), int(s or 0))
        try:
            when = float(calendar.timegm((*fields, 0, 0, 0)) if utc else time.mktime((*fields, 0, 0, -1)))
        except (OverflowError, ValueError):
            raise WhenError(f"--at {text!r}: no such date") from None
        if not (1 <= fields[1] <= 12 and 1 <= fields[2] <= 31 and fields[3] < 24 and fields[4] < 60 and fields[5] < 60):
            raise WhenError(f"--at {text!r}: no such date")
    elif match := _CLOCK.fullmatch(text):
        h, mi, s = int(match[1]), int(match[2]), int(match[3] or 0)
        if h >= 24 or mi >= 60 or s >= 60:
            raise WhenError(f"--at {text!r}: no such time of day")
        day = time.localtime(start)
        when = time.mktime((day.tm_year, day.tm_mon, day.tm_mday, h, mi, s, 0, 0, -1))
        while when < start and when + DAY_S <= end:
            when += DAY_S
    else:
        raise WhenError(f"--at {text!r}: expected +DURATION (after the start), -DURATION (before the end), HH:MM[:SS], "
                        "YYYY-MM-DD HH:MM[:SS][Z], start or end (durations like 90s, 30m, 1h30m, 2d)")
    if when < start:
        raise WhenError(f"--at {text!r} is {stamp(when)}, before the run's start: {life}")
    if when > end:
        raise WhenError(f"--at {text!r} is {stamp(when)}, after the run's end: {life}")
    return when
