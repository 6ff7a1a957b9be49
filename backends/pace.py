"""How fast a run steps and when it will end, from its step events: one reckoning for the
dashboard's tokens/s and ETA and for `trackside runs --json`, so the headless listing says
what the screen shows."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import islice

RATE_WINDOW = 20  # the latest step events a rate is measured over: recent, not since start


def steps_per_s(steps: Sequence[dict]) -> float | None:
    """Steps a second over the latest RATE_WINDOW step events that carry a time."""
    # From the end without copying the rest: a dashboard's history holds thousands.
    latest = list(islice(reversed(steps), RATE_WINDOW))[::-1]
    recent = [e for e in latest if isinstance(e.get("time"), (int, float))]
    if len(recent) < 2:
        return None
    dt = recent[-1]["time"] - recent[0]["time"]
    first, last = recent[0].get("step"), recent[-1].get("step")
    if not (_whole(first) and _whole(last)):
        return None  # a step written as something else: no pace from it
    ds = last - first
    return ds / dt if dt > 0 and ds > 0 else None


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def total_steps(start: dict | None, params: dict) -> int | None:
    """The steps the run will take: the trainer's resolved config, else the launch's params."""
    config = (start or {}).get("config")
    total = (config if isinstance(config, dict) else {}).get("steps") or params.get("steps")
    return total if _whole(total) else None


def eta_s(steps: Sequence[dict], total: int | None) -> float | None:
    """Seconds to the run's last step at its recent rate; None while either is unknown."""
    rate = steps_per_s(steps)
    step = steps[-1].get("step") if steps else None
    if rate is None or total is None or not _whole(step):
        return None
    return max(0.0, (total - step) / rate)
