"""The loss chart: the total and one curve per TTT step (a DFlash run: per block position,
the first, a middle and the last, with its expected accepted length τ beside the legend),
EMA-smoothed, linear or log y, by step or by tokens seen, with other runs' losses (its
ancestors, runs picked from the fleet) drawn dim behind it.

Drawn here in braille, not by plotext: plotext rebuilt a 200 × 24 chart in ~20 ms of
Python, the app re-read 5,000 step events to smooth them on every replot, and each `y`
or `s` press waited for both (docs/load.md). Here the curves are smoothed as steps
arrive, cut to one point per dot column, and drawn in a few ms.
"""

from __future__ import annotations

import functools
import math
import time
from collections import deque

from rich.style import Style
from rich.text import Text
from textual.app import RenderResult
from textual.timer import Timer
from textual.widget import Widget

from backends.series import Overlay, SeriesError, number
from tui.state import STEP_HISTORY, RunState, format_number
from tui.guard import Guarded

X_AXES = ("step", "tokens")  # what `x` toggles between
MIN_SIZE = (24, 8)  # columns, rows below which there is no chart worth drawing
REPLOT_S = 0.5
SMOOTHING = [1.0, 0.3, 0.1, 0.03]  # the EMA weights `s` cycles through; 1.0 shows raw values
TOTAL = Style(color="#e4e4e4", bold=True)
STEP_COLORS = [Style(color=c) for c in ("#5f87ff", "#5fd75f", "#ff8700", "#d787ff", "#00d7d7", "#ffd75f")]
AXIS = Style(dim=True)
OVERLAY_COLORS = [Style(color=c, dim=True) for c in ("#bcbcbc", "#8a8a8a", "#d7af87", "#87afaf", "#af87af")]
TITLE = Style(bold=True)
TAU = Style(color="#ff87af", bold=True)
TAU_CELLS = 16  # τ's course beside the legend
SPARKS = "▁▂▃▄▅▆▇█"
# Braille dots of one character cell: DOTS[dot column][dot row], rows from the top.
DOTS = ((0x01, 0x02, 0x04, 0x40), (0x08, 0x10, 0x20, 0x80))
# RUNS[dot column][top][bottom]: the bits of a vertical run of dots within one cell.
RUNS = [[[sum(DOTS[side][top : bottom + 1]) for bottom in range(4)] for top in range(4)] for side in range(2)]


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
    # A block position counts from 1, the anchor's next token, as the trainer's weights do.
    return tuple(f"pos {i + 1}" if kind == "pos" else f"ttt {i}" for i in items)


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


class LossChart(Guarded, Widget):
    DEFAULT_CSS = """
    LossChart {
        width: 1fr;
        height: 1fr;
    }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.log_y = False
        self.x_axis = "step"
        self.curves = Curves(0.3)
        self.overlaid: list[Overlaid] = []
        self._overlays: tuple[dict, float] | None = None  # the run's overlays and the smoothing drawn
        self.run: RunState | None = None
        self._last = 0.0  # monotonic time of the last replot
        self._pending: Timer | None = None

    @property
    def smoothing(self) -> float:
        """The EMA weight of the newest point; 1.0 shows raw values."""
        return self.curves.smoothing

    def on_mount(self) -> None:
        self.set_interval(REPLOT_S, self._catch_up)

    def _catch_up(self) -> None:
        """Draw what a console's curve gained: no step event tells the screen it grew."""
        if self.run is None or self._pending is not None:
            return
        source = entries_of(self.run)[0]
        if source and (source is not self.curves.source or source[-1] is not self.curves.newest):
            self.replot()
        elif self._overlays_stale():  # read by a worker meanwhile
            self.replot()

    def show(self, run: RunState | None) -> None:
        """Plot `run`; at most every REPLOT_S (data arrive faster than anyone reads them),
        the latest data last."""
        self.run = run
        if self._pending is not None:
            return
        wait = self._last + REPLOT_S - time.monotonic()
        if wait <= 0:
            self.replot()
        else:
            self._pending = self.set_timer(wait, self._replot_pending)

    def _replot_pending(self) -> None:
        self._pending = None
        self.replot()

    def replot(self) -> None:
        self._last = time.monotonic()
        if self.run is not None:
            self.curves.update(self.run)
            if self._overlays_stale():
                self._overlays = (self.run.overlays, self.smoothing)
                self.overlaid = [Overlaid(o, self.smoothing) for o in self.run.overlays.values()]
        self.refresh()

    def toggle_log(self) -> None:
        self.log_y = not self.log_y
        self.replot()

    def _overlays_stale(self) -> bool:
        # By identity: the app replaces a run's overlays whole, and comparing thousands
        # of step records every half second would cost what the chart saves.
        drawn = self._overlays
        return drawn is None or drawn[0] is not self.run.overlays or drawn[1] != self.smoothing

    def toggle_x(self) -> None:
        self.x_axis = X_AXES[(X_AXES.index(self.x_axis) + 1) % len(X_AXES)]
        self.replot()

    def cycle_smoothing(self) -> None:
        current = self.smoothing
        self.curves.resmooth(SMOOTHING[(SMOOTHING.index(current) + 1) % len(SMOOTHING)] if current in SMOOTHING else 0.3)
        self.replot()

    def render(self) -> RenderResult:
        width, height = self.size
        if width < MIN_SIZE[0] or height < MIN_SIZE[1]:
            return ""
        run = self.run is not None
        return draw(self.curves if run else None, width, height, self.log_y, self.overlaid if run else (), self.x_axis)


def draw(
    curves: Curves | None, width: int, height: int, log_y: bool, overlaid: list[Overlaid] = (), x_axis: str = "step"
) -> Text:
    """The chart as `height` lines of `width` cells: a title and legend (and the overlays'
    legend), the curves in braille dots against a y axis, and the x axis below.

    By tokens seen only when the run logs its tokens (a console's curve does not): else by
    step. Overlays are cut to the run's own x range: the question is how the runs compare
    at the same step, and an ancestor's longer run would squeeze this one into a corner."""
    smoothing = curves.smoothing if curves is not None else 0.3
    points = thinned(curves, log_y, width) if curves is not None else []
    tokens = list(curves.tokens) if curves is not None else []
    by = " by tokens seen" if x_axis == "tokens" else ""
    if x_axis == "tokens" and None in tokens:
        x_axis, by = "step", " by step (tokens not logged)"
    title = f"loss{by} ({smoothing_words(smoothing)}, {'log' if log_y else 'linear'} y)"
    own = [y for _, ys in points for y in ys if y is not None]
    if not own:
        points = []
    steps = (tokens if x_axis == "tokens" else list(curves.steps)) if points else []  # indexed hundreds of times: a deque's middle is not O(1)
    behind = [o.points.get(x_axis, []) for o in overlaid]
    if steps and steps[-1] > steps[0]:
        x0, x1 = steps[0], steps[-1]
    else:  # one point or none of its own yet (a relaunch just started): the overlays' range
        xs = [*steps, *(p[0] for ps in behind for p in ps)]
        x0, x1 = min(xs, default=0), max(xs, default=0)
    behind = [overlay_points(ps, x0, x1, log_y, width) for ps in behind]
    found = own + [y for ps in behind for _, y in ps]
    text = Text(no_wrap=True, overflow="crop", end="")
    if not found:
        text.append(title.center(width), TITLE)
        text.append("\n" * (height - 1))
        return text
    y0, y1 = min(found), max(found)
    if y1 - y0 < 1e-12:
        y0, y1 = y0 - 0.5, y1 + 0.5
    rows = height - 3 - bool(overlaid)  # title (and the overlays' legend) above, axis and its labels below
    label = (lambda v: format_number(10**v, 3)) if log_y else (lambda v: format_number(v, 4))
    marks = ticks(rows)
    y_labels = {r: label(y1 - (r + 0.5) / rows * (y1 - y0)) for r in marks}
    margin = max(map(len, y_labels.values()))
    cols = width - margin - 2
    bits = [bytearray(cols) for _ in range(rows)]
    owner = [bytearray(cols) for _ in range(rows)]  # 1 + the curve drawn last in each cell
    dots_x, dots_y = 2 * cols - 1, 4 * rows - 1
    x_scale = dots_x / (x1 - x0) if x1 > x0 else 0.0
    y_scale = dots_y / (y1 - y0)
    # The total last, on top of the TTT steps it summarises; other runs just behind it,
    # over the TTT steps' fan, where their totals would otherwise be lost.
    def draw_own(k: int) -> None:
        xs, ys = points[k]
        plot(bits, owner, k + 1, [round((steps[i] - x0) * x_scale) for i in xs], [None if y is None else round((y1 - y) * y_scale) for y in ys])

    for k in range(1, len(points)):
        draw_own(k)
    for j, ps in enumerate(behind):
        plot(bits, owner, len(points) + 1 + j, [round((x - x0) * x_scale) for x, _ in ps], [round((y1 - y) * y_scale) for _, y in ps])
    if points:
        draw_own(0)
    styles = [None, TOTAL, *[STEP_COLORS[(k - 1) % len(STEP_COLORS)] for k in range(1, len(points))]]
    styles += [OVERLAY_COLORS[j % len(OVERLAY_COLORS)] for j in range(len(behind))]
    text.append(" " * (margin + 2))
    text.append(title, TITLE)
    for k, name in enumerate(curves.labels[: len(points)] if points else ()):
        text.append("  ")
        text.append("━━ " + name, styles[k + 1])
    tau = tau_legend(curves) if curves is not None else None
    if tau:
        text.append("  ")
        text.append(tau)
    if overlaid:
        text.append("\n" + " " * (margin + 2))
        for j, o in enumerate(overlaid):
            text.append("  " if j else "")
            text.append("┄┄ " + o.label + ("" if behind[j] else " (none in view)"), styles[len(points) + 1 + j])
    for r in range(rows):
        text.append("\n")
        text.append(y_labels.get(r, "").rjust(margin), AXIS)
        text.append("┤ " if r in y_labels else "│ ", AXIS)
        cells, who = bits[r], owner[r]
        c = 0
        while c < cols:
            k = who[c]
            end = c + 1
            while end < cols and who[end] == k:
                end += 1
            text.append("".join(chr(0x2800 + b) if b else " " for b in cells[c:end]), styles[k])
            c = end
    count = max(2, cols // 20 + 1)  # a labelled step every ~20 columns
    tick_cols = [round(i * (cols - 1) / (count - 1)) for i in range(count)]
    axis = ["─"] * cols
    placed: list[tuple[int, str]] = []  # (first cell, label), left to right
    end = 0  # the cell after the last label placed
    for c in tick_cols:
        axis[c] = "┬"
        value = x0 + c / max(1, cols - 1) * (x1 - x0)
        name = f"{value:,.0f}" if abs(x1 - x0) >= 10 else format_number(value, 3)
        start = min(max(0, margin + 2 + c - len(name) // 2), width - len(name))
        if start > end or not placed:
            placed.append((start, name))
            end = start + len(name)
    text.append("\n")
    text.append(("step" if x_axis == "step" else "tok").rjust(margin)[-margin:] + " └" + "".join(axis), AXIS)
    text.append("\n")
    # Each label its own span, the gaps unstyled: an SVG export draws a span's text from
    # its first cell, and renderers collapse a long run of spaces inside one.
    end = 0
    for start, name in placed:
        text.append(" " * (start - end))
        text.append(name, AXIS)
        end = start + len(name)
    return text


def tau_legend(curves: Curves) -> Text | None:
    """A DFlash run's τ (expected accepted tokens per block): the latest logged, as the
    stats show it, and its course over the run in a few cells, smoothed as the losses are."""
    latest = next((v for v in reversed(curves.tau_raw) if v is not None), None)
    if latest is None:
        return None
    values = list(curves.tau)
    values = values[next(i for i, v in enumerate(values) if v is not None) :]
    cells = min(TAU_CELLS, len(values))
    course = [values[round(i * (len(values) - 1) / max(1, cells - 1))] for i in range(cells)]
    low, high = min(course), max(course)
    scale = (len(SPARKS) - 1) / (high - low) if high > low else 0.0
    return Text.assemble(("τ ", TAU), (format_number(latest, 3), TAU), " ",
                         ("".join(SPARKS[round((v - low) * scale)] for v in course), TAU))


def overlay_points(points: list[tuple[float, float]], x0: float, x1: float, log_y: bool, width: int) -> list[tuple[float, float]]:
    """Another run's points within the x range, about one per dot column, on the y axis."""
    inside = [(x, y) for x, y in points if x0 <= x <= x1 and y is not None and (y > 0 or not log_y)]
    stride = max(1, math.ceil(len(inside) / max(1, 2 * width)))
    kept = inside[::stride]
    if kept and kept[-1] is not inside[-1]:
        kept.append(inside[-1])
    return [(x, math.log10(y) if log_y else y) for x, y in kept]


def smoothing_words(weight: float) -> str:
    """An EMA weight as an operator reads it: about how many points it averages."""
    if weight >= 1:
        return "smoothing off"
    return f"smoothed over ~{round(2 / weight - 1)} points"


def ticks(count: int) -> list[int]:
    """About one labelled row in four, first and last included."""
    n = max(2, min(count, (count + 3) // 4 + 1))
    return sorted({round(i * (count - 1) / (n - 1)) for i in range(n)})


def thinned(curves: Curves, log_y: bool, width: int) -> list[tuple[list[int], list[float | None]]]:
    """Per curve, the indices of at most about one point per dot column (every n-th
    entry counted from the start over, so the kept points do not shift as entries
    arrive; the newest always), and their values on the y axis (None for a gap)."""
    n = len(curves.steps)
    if not n:
        return []
    stride = max(1, math.ceil(n / max(1, 2 * width)))
    first = (stride - (curves.count - n) % stride) % stride
    kept = list(range(first, n, stride))
    if not kept or kept[-1] != n - 1:
        kept.append(n - 1)
    out = []
    for smooth in curves.smooth:
        smooth = list(smooth)
        values = [smooth[i] for i in kept]
        if log_y:
            values = [math.log10(v) if v is not None and v > 0 else None for v in values]
        out.append((kept, values))
    return out


def plot(bits: list[bytearray], owner: list[bytearray], mark: int, xs: list[int], ys: list[int | None]) -> None:
    """Draw one curve: each point joined to the next by the dots between them."""
    rows = len(bits)
    previous = None
    for x, y in zip(xs, ys):
        if y is None:
            previous = None
            continue
        if previous is None or previous[0] >= x:
            spans = [(x, y, y)] if previous is None else [(x, min(previous[1], y), max(previous[1], y))]
        else:
            px, py = previous
            spans = []
            last = py
            for col in range(px + 1, x + 1):
                at = round(py + (y - py) * (col - px) / (x - px))
                spans.append((col, min(last, at), max(last, at)))
                last = at
        for col, top, bottom in spans:
            cx, side = col >> 1, col & 1
            for cy in range(max(0, top >> 2), min(rows - 1, bottom >> 2) + 1):
                bits[cy][cx] |= RUNS[side][top & 3 if cy == top >> 2 else 0][bottom & 3 if cy == bottom >> 2 else 3]
                owner[cy][cx] = mark
        previous = (x, y)
