"""A run's metrics.jsonl folded: one fold for the listing (`trackside runs`, which reads a
run's first and last lines) and for the dashboard (which follows the whole file).

Event and field names are the contract's (training/contract.py). A start event begins the
run again (a relaunch into its run dir, or a resume): the earlier end and OOM no longer
hold, a resume's steps after its checkpoint are logged again (the earlier ones are
dropped), and the pace is measured from the steps since.
"""

from __future__ import annotations

import math
from collections import deque
from itertools import islice

from backends import pace
from training.contract import END, NONFINITE, OOM, START, STEP


class MetricsRecord:
    """Step events kept (the latest `keep`), the latest start, oom, end and nonfinite events."""

    def __init__(self, keep: int) -> None:
        self.steps: deque[dict] = deque(maxlen=keep)
        self.start: dict | None = None
        self.oom: dict | None = None
        self.end: dict | None = None
        self.nonfinite: dict | None = None  # the latest skipped step's event
        self._since_start = 0  # step events since the latest start: what the pace is measured over
        self._window: list[dict] | None = None  # pace_window's, until a step or start is added

    def add(self, event: dict) -> None:
        kind = event.get("event")
        if kind in (STEP, START):
            self._window = None
        if kind == STEP:
            # Lists as tuples: the dict then holds only atomic values, and the garbage
            # collector stops tracking it; 5,000 steps of two lists each were a quarter of
            # what every full pass walked, tens of ms that land on key presses (docs/load.md).
            self.steps.append({k: tuple(v) if isinstance(v, list) else v for k, v in event.items()})
            self._since_start += 1
        elif kind == START:
            self.start, self.oom, self.end, self.nonfinite, self._since_start = event, None, None, None, 0
            config = event.get("config")
            resumed = _count(config.get("resumed_from_step")) if isinstance(config, dict) else None
            if resumed is not None and self.steps and (_count(self.steps[-1].get("step")) or 0) > resumed:
                kept = [e for e in self.steps if (_count(e.get("step")) or 0) <= resumed]
                self.steps.clear()
                self.steps.extend(kept)
        elif kind == OOM:
            self.oom = event
        elif kind == NONFINITE:
            self.nonfinite = event
        elif kind == END:
            self.end = event

    @property
    def config(self) -> dict:
        """The start event's config, or {} where it has none (or garbage)."""
        config = (self.start or {}).get("config")
        return config if isinstance(config, dict) else {}

    @property
    def last(self) -> dict | None:
        return self.steps[-1] if self.steps else None

    @property
    def end_status(self) -> str | None:
        status = (self.end or {}).get("status")
        return status if isinstance(status, str) else None

    @property
    def steps_per_epoch(self) -> int | None:
        count = _count((self.start or {}).get("steps_per_epoch"))
        return count if count is not None and count >= 1 else None

    @property
    def step(self) -> int | None:
        """The latest step event's step, if a whole number."""
        return _count((self.last or {}).get("step"))

    def value(self, field: str) -> float | None:
        """The latest step's `field`, if a finite number (metrics.jsonl is parsed so that
        NaN and infinities read as absent; an event made elsewhere may still hold one)."""
        value = (self.last or {}).get(field)
        return value if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) else None

    def pace_window(self) -> list[dict]:
        """The step events its pace is measured over (backends/pace.py), all since its
        latest start; found again only after a new step or start (the dashboard asks on
        every repaint, and a minute of fast steps is thousands)."""
        if self._window is None:
            self._window = pace.window(islice(reversed(self.steps), self._since_start))
        return self._window

    def tokens_per_s(self) -> float | None:
        """Over its pace window (pace.WINDOW_S)."""
        return pace.tokens_per_s(self.pace_window())

    def eta_s(self, params: dict) -> float | None:
        """To the run's last step at its pace over its window since its latest start."""
        return pace.eta_s(self.pace_window(), pace.total_steps(self.start, params))


def _count(value) -> int | None:
    """A step count as the trainer writes one: a whole number; anything else is none."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None
