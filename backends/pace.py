"""How fast a run steps and when it will end, from its step events: one reckoning for the
dashboard's tokens/s and ETA and for `trackside runs` (and its --json), so the headless
listing says what the screen shows."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

# The trainer's seconds that tokens/s and the rate behind the ETA are measured over: long
# enough that a slow step or a checkpoint's pause moves neither several-fold (over the
# latest 20 events, about a second, an ETA read 10m58s, 1h04m, 10m45s within a minute),
# short enough to follow a change of pace within a minute. Every place that shows them
# says so (WINDOW_LABEL).
WINDOW_S = 60
WINDOW_LABEL = f"{WINDOW_S} s"


def window(steps_latest_first: Iterable[dict]) -> list[dict]:
    """The step events the pace is measured over, oldest first: from the latest back to the
    first at least WINDOW_S older on the trainer's clock (fewer in a younger run; a run
    slower than a step per WINDOW_S has its latest two). Events without a time are left out."""
    taken: list[dict] = []
    for event in steps_latest_first:
        time = event.get("time")
        if not _number(time):
            continue
        taken.append(event)
        if time <= taken[0]["time"] - WINDOW_S and len(taken) >= 2:
            break
    return taken[::-1]


def steps_per_s(recent: Sequence[dict]) -> float | None:
    """Steps a second over `recent` (a window, oldest first)."""
    span = _span(recent)
    if span is None:
        return None
    first, last = recent[0].get("step"), recent[-1].get("step")
    if not (_whole(first) and _whole(last)):
        return None  # a step written as something else: no pace from it
    ds = last - first
    return ds / span if ds > 0 else None


def tokens_per_s(recent: Sequence[dict]) -> float | None:
    """Tokens a second over `recent` (a window, oldest first): the tokens of its steps after
    the first, over the seconds from the first to the last, pauses between steps included
    (as the ETA counts them); none if a step in it does not say its tokens."""
    span = _span(recent)
    tokens = [e.get("tokens") for e in recent[1:]]
    if span is None or not all(_number(t) and t >= 0 for t in tokens):
        return None
    return sum(tokens) / span


def _span(recent: Sequence[dict]) -> float | None:
    if len(recent) < 2:
        return None
    seconds = recent[-1]["time"] - recent[0]["time"]
    return seconds if seconds > 0 else None


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def total_steps(start: dict | None, params: dict) -> int | None:
    """The steps the run will take: the trainer's resolved config, else the launch's params."""
    config = (start or {}).get("config")
    total = (config if isinstance(config, dict) else {}).get("steps") or params.get("steps")
    return total if _whole(total) else None


def eta_s(recent: Sequence[dict], total: int | None) -> float | None:
    """Seconds to the run's last step at its rate over `recent` (a window, oldest first, its
    last the latest step); None while either is unknown."""
    rate = steps_per_s(recent)
    step = recent[-1].get("step") if recent else None
    if rate is None or total is None or not _whole(step):
        return None
    return max(0.0, (total - step) / rate)
