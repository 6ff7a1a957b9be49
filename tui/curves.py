"""A run's loss curves as the chart plots them: the total and one curve per TTT step, or
per shown block position for a DFlash run, EMA-smoothed as steps arrive (not on every
replot), with tokens seen per step for the tokens axis; and other runs' losses, smoothed
alike, to draw behind.
"""

from __future__ import annotations

import functools
from collections import deque

from backends.logs.series import Overlay, SeriesError, number, part_name
from tui.state import STEP_HISTORY, RunState

X_AXES = ("step", "tokens")  # what `x` toggles between


def positions_shown(count: int) -> tuple[int, ...]:
    """Which of a DFlash block's `count` positions get a curve: the first, a middle and the
    last. All of a 16-token block's would be a tangle; these three span its fan."""
    return tuple(sorted({0, (count - 1) // 2, count - 1})) if count else ()


def _parts(event: dict) -> tuple[str, tuple[int, ...], object]:
    """An event's curves beyond its total: (what they are, which items, its list)."""
    positions = event.get("loss_pos")
    if isinstance(positions, (list, tuple)):
        return "pos", positions_shown(len(positions)), positions
    ttt = event.get("loss_ttt")
    ttt = ttt if isinstance(ttt, (list, tuple)) else ()
    return "ttt", tuple(range(len(ttt))), ttt


def step_entry(event: dict) -> tuple[float | None, list]:
    _, items, values = _parts(event)
    return number(event.get("step")), [number(event.get("loss")), *(number(values[i]) for i in items)]


@functools.cache
def _names(kind: str, items: tuple[int, ...]) -> tuple[str, ...]:
    return tuple(part_name(kind, i) for i in items)  # what `trackside plot --metric` takes


def step_names(event: dict) -> tuple[str, ...]:
    kind, items, _ = _parts(event)
    return _names(kind, items)


def entries_of(run: RunState) -> tuple[deque, str, object, object]:
    """Where a run's curve points come from, the name of its first curve, how to read one
    entry as (step, [value per curve]): the total first, so its index never moves; and the
    names of an entry's other curves."""
    if run.steps:
        return run.steps, "total", step_entry, step_names
    return run.console_loss, "loss", lambda pair: (number(pair[0]), [number(pair[1])]), lambda pair: ()


class Curves:
    """A run's loss curves, smoothed as its entries arrive rather than on every replot."""

    def __init__(self, smoothing: float) -> None:
        self.smoothing = smoothing
        self.source: deque | None = None
        self.newest: object = None  # the source's entry folded in last
        self.labels: list[str] = []
        self.steps: deque = deque(maxlen=STEP_HISTORY)
        self.tokens: deque = deque(maxlen=STEP_HISTORY)  # tokens seen by each entry's end; None: not logged
        self.seen = 0.0
        self.count = 0  # entries folded in since the start over: where thinning keeps its phase
        self.raw: list[deque] = []  # per curve; None where an entry lacks the value
        self.smooth: list[deque] = []
        self.ema: list[float | None] = []  # each curve's EMA so far
        # A DFlash run's τ per entry (None where not logged), smoothed like a curve but
        # not drawn on the loss axis: it counts tokens.
        self.tau_raw: deque = deque(maxlen=STEP_HISTORY)
        self.tau: deque = deque(maxlen=STEP_HISTORY)
        self.tau_ema: float | None = None

    def update(self, run: RunState) -> None:
        """Fold in what `run` appended since the last update; start over on anything else
        (another run, its streams read again, more TTT steps than before, another block
        size)."""
        source, first, read, names = entries_of(run)
        fresh = self._fresh(source)
        entries = None if fresh is None else [read(e) for e in fresh]
        known = tuple(self.labels[1:])
        if entries is None or any(step_names != known[: len(step_names)] for step_names in map(names, fresh)):
            fresh = list(source)
            entries = [read(e) for e in fresh]
            # the newest of the widest: a run relaunched into its dir with another block
            # size is named as it is now
            widest = max(map(names, reversed(fresh)), key=len, default=())
            self.source, self.labels = source, [first, *widest]
            width = len(self.labels)
            self.steps.clear()
            self.tokens.clear()
            self.seen = 0.0
            self.count = 0
            self.raw = [deque(maxlen=STEP_HISTORY) for _ in range(width)]
            self.ema = [None] * width
            self.smooth = [deque(maxlen=STEP_HISTORY) for _ in range(width)]
            self.tau_raw.clear()
            self.tau.clear()
            self.tau_ema = None
        self.newest = source[-1] if source else None
        self.count += len(entries)
        for step, _ in entries:
            self.steps.append(step if step is not None else self.steps[-1] + 1 if self.steps else 0)
        taus = []
        for entry in fresh:
            is_event = isinstance(entry, dict)
            tokens = number(entry.get("tokens")) if is_event else None
            self.seen += tokens or 0.0
            self.tokens.append(self.seen if tokens is not None else None)
            taus.append(number(entry.get("tau")) if is_event else None)
        self.tau_raw.extend(taus)
        self._smooth_tau(taus)
        for k, raw in enumerate(self.raw):
            column = [values[k] if k < len(values) else None for _, values in entries]
            raw.extend(column)
            self._smooth(k, column)

    def resmooth(self, smoothing: float) -> None:
        self.smoothing = smoothing
        self.ema = [None] * len(self.raw)
        self.smooth = [deque(maxlen=STEP_HISTORY) for _ in self.raw]
        for k, raw in enumerate(self.raw):
            self._smooth(k, raw)
        self.tau_ema = None
        self.tau.clear()
        self._smooth_tau(self.tau_raw)

    def _smooth_tau(self, values) -> None:
        smoothed = ema(values, self.smoothing, self.tau_ema)
        self.tau.extend(smoothed)
        if smoothed:
            self.tau_ema = smoothed[-1]

    def _fresh(self, source: deque) -> list | None:
        """The entries after the newest one folded in; None when that one is gone."""
        if source is not self.source or self.newest is None:
            return None
        for i in range(len(source) - 1, -1, -1):
            if source[i] is self.newest:
                return [source[j] for j in range(i + 1, len(source))]
        return None

    def _smooth(self, k: int, values) -> None:
        smoothed = ema(values, self.smoothing, self.ema[k])
        self.smooth[k].extend(smoothed)
        if smoothed:
            self.ema[k] = smoothed[-1]


def ema(values, alpha: float, last: float | None = None) -> list[float | None]:
    """Each value's exponential moving average, from `last` on (None until a first value)."""
    keep, out = 1 - alpha, []
    for v in values:
        if v is not None:
            last = v if last is None else alpha * v + keep * last
        out.append(last)
    return out


class Overlaid:
    """Another run's loss as this chart draws it: smoothed like the run's own, per x axis
    (a console's curve has no tokens)."""

    def __init__(self, overlay: Overlay, smoothing: float) -> None:
        self.label = overlay.label
        self.points: dict[str, list[tuple[float, float]]] = {}
        for axis in X_AXES:
            try:
                xs, ys = zip(*overlay.series.curve("loss", axis))
            except SeriesError:
                continue
            self.points[axis] = list(zip(xs, ema(ys, smoothing)))
