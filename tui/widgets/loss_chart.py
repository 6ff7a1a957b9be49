"""The loss chart widget and its braille drawing: the curves of `tui.curves` (a run's
total, its TTT steps or DFlash block positions, τ ahead of them in the legend), linear or log y,
by step or by tokens seen, other runs' losses drawn dim behind.

Braille rather than plotext, whose full rebuild per replot the dashboard could not afford
(docs/load.md): the curves arrive smoothed and are cut to one point per dot column here.
"""

from __future__ import annotations

import math
import time

from rich.cells import cell_len
from rich.style import Style
from rich.text import Text
from textual.app import RenderResult
from textual.timer import Timer
from textual.widget import Widget

from tui.curves import X_AXES, Curves, Overlaid, entries_of
from tui.guard import Guarded
from tui.state import RunState, format_number

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


class LossChart(Guarded, Widget):
    DEFAULT_CSS = f"""
    LossChart {{
        width: 1fr;
        height: 1fr;
        min-height: {MIN_SIZE[1]};
        text-wrap: nowrap;  /* a line too long is cut, never wrapped onto the axis's rows */
        text-overflow: clip;
    }}
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
        counts = counts_of(self.run) if run else "step"
        return draw(self.curves if run else None, width, height, self.log_y, self.overlaid if run else (), self.x_axis, counts)


def counts_of(run: RunState) -> str:
    """What a run's step axis counts: its step events' steps, else its console's (a boosting
    library's rounds, or the losses printed where no step was)."""
    return "step" if run.steps else run.console.axis


def draw(
    curves: Curves | None, width: int, height: int, log_y: bool, overlaid: list[Overlaid] = (), x_axis: str = "step",
    counts: str = "step",
) -> Text:
    """The chart as `height` lines of `width` cells: a title and legend (and the overlays'
    legend), the curves in braille dots against a y axis, and the x axis below. `counts`:
    what the step axis counts (ConsoleSummary.axis: a step, a boosting round, a printed
    point where the console said no step), named in the title and under the axis.

    By tokens seen only when the run logs its tokens (a console's curve does not): else by
    step. Overlays are cut to the run's own x range: the question is how the runs compare
    at the same step, and an ancestor's longer run would squeeze this one into a corner."""
    smoothing = curves.smoothing if curves is not None else 0.3
    points = thinned(curves, log_y, width) if curves is not None else []
    tokens = list(curves.tokens) if curves is not None else []
    by = " by tokens seen" if x_axis == "tokens" else ""
    if x_axis == "tokens" and None in tokens:
        x_axis, by = "step", " by step (tokens not logged)"
    if x_axis == "step" and counts != "step":
        by = {"round": " by round", "point": " by printed point (no step printed)"}.get(counts, f" by {counts}")
    scale = "log" if log_y else "linear"
    # The title shortened where the legend beside it needs the room (legend_line).
    titles = (f"loss{by} ({smoothing_words(smoothing)}, {scale} y)",
              f"loss{by} ({smoothing_words(smoothing, short=True)}, {scale[:3]} y)", "loss")  # fmt: skip
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
        text.append(titles[0].center(width), TITLE)
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
    room = width - margin - 2
    text.append(" " * (margin + 2))
    names = curves.labels[: len(points)] if points else []
    text.append(legend_line(titles, curves, list(zip(names, styles[1:])), room))
    if overlaid:
        text.append("\n" + " " * (margin + 2))
        labels = [o.label + ("" if behind[j] else " (none in view)") for j, o in enumerate(overlaid)]
        text.append(entries_line("┄", labels, styles[len(points) + 1 :], room))
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
    said = {"point": "pt"}.get(counts, counts) if x_axis == "step" else "tok"
    text.append(said.rjust(margin)[-margin:] + " └" + "".join(axis), AXIS)
    text.append("\n")
    # Each label its own span, the gaps unstyled: an SVG export draws a span's text from
    # its first cell, and renderers collapse a long run of spaces inside one.
    end = 0
    for start, name in placed:
        text.append(" " * (start - end))
        text.append(name, AXIS)
        end = start + len(name)
    return text


def legend_line(titles: tuple[str, ...], curves: Curves | None, entries: list[tuple[str, Style]], room: int) -> Text:
    """The title, a DFlash run's τ and each curve's name in its colour, on one line of
    `room` cells: the marks narrowed, τ's course shortened, then the title, before the
    chart's edge cuts what is left. τ comes before the legend: it is DFlash's headline."""
    line = Text()
    for title in titles:
        for mark, gap, cells in (("━━ ", "  ", TAU_CELLS), ("━ ", " ", TAU_CELLS), ("━ ", " ", TAU_CELLS // 2)):
            line = Text(title, TITLE)
            tau = tau_legend(curves, cells) if curves is not None else None
            if tau:
                line.append(gap)
                line.append(tau)
            for name, style in entries:
                line.append(gap)
                line.append(mark + name, style)
            if line.cell_len <= room:
                return line
    return line


def entries_line(mark: str, labels: list[str], styles: list[Style], room: int) -> Text:
    """Other runs' names in their colours on one line of `room` cells: each name whole where
    they fit, else each cut to a fair share (the shortest whole), so every colour is named."""
    wide = sum(3 + cell_len(label) for label in labels) + 2 * (len(labels) - 1)
    mark, gap = (mark * 2 + " ", "  ") if wide <= room else (mark + " ", " ")
    left = room - (len(mark) + len(gap)) * len(labels) + len(gap)
    cut: dict[int, Text] = {}
    for k, i in enumerate(sorted(range(len(labels)), key=lambda i: cell_len(labels[i]))):
        share = max(1, left // (len(labels) - k))
        cut[i] = Text(labels[i])
        cut[i].truncate(share, overflow="ellipsis")
        left -= cut[i].cell_len
    line = Text()
    for i, style in zip(range(len(labels)), styles):
        line.append(gap if i else "")
        line.append(mark, style)
        line.append(cut[i].plain, style)
    return line


def tau_legend(curves: Curves, cells: int = TAU_CELLS) -> Text | None:
    """A DFlash run's τ (expected accepted tokens per block): the latest logged, as the
    stats show it, and its course over the run in a few cells, smoothed as the losses are."""
    latest = next((v for v in reversed(curves.tau_raw) if v is not None), None)
    if latest is None:
        return None
    values = list(curves.tau)
    values = values[next(i for i, v in enumerate(values) if v is not None) :]
    cells = min(cells, len(values))
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


def smoothing_words(weight: float, short: bool = False) -> str:
    """An EMA weight as an operator reads it: about how many points it averages."""
    if weight >= 1:
        return "raw" if short else "smoothing off"
    return f"~{round(2 / weight - 1)}-pt avg" if short else f"smoothed over ~{round(2 / weight - 1)} points"


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
