"""The run's whole life on one time axis: its loss (its step events' times), and under it
its host's GPUs' power and memory from the recording (backends/history/life.py), in
braille as the loss chart draws. A span the recorder did not cover is left blank.
"""

from __future__ import annotations

import time

from rich.style import Style
from rich.text import Text
from textual.app import RenderResult
from textual.widget import Widget

from backends.history.life import Life, life_of
from backends.logs.series import number
from tui.guard import Guarded
from tui.state import RunState, format_number
from tui.widgets.loss_chart import AXIS, MIN_SIZE, TITLE, TOTAL, plot

POWER = Style(color="#5fd75f")
MEMORY = Style(color="#00d7d7")
MARGIN = 6  # the y labels' cells


def band(xs: list[float], ys: list[float | None], rows: int, cols: int, x0: float, x1: float, style: Style, label) -> list[Text]:
    """`rows` lines of braille: the points (x, y) between x0 and x1, y from its least to
    its most (labelled at the top and bottom rows); None leaves a gap."""
    found = [y for y in ys if y is not None]
    lines = []
    if not found:
        return [Text(" " * cols) for _ in range(rows)]
    y0, y1 = min(found), max(found)
    if y1 - y0 < 1e-12:
        y0, y1 = y0 - 0.5, y1 + 0.5
    bits = [bytearray(cols) for _ in range(rows)]
    owner = [bytearray(cols) for _ in range(rows)]
    x_scale = (2 * cols - 1) / (x1 - x0) if x1 > x0 else 0.0
    y_scale = (4 * rows - 1) / (y1 - y0)
    plot(bits, owner, 1, [round((x - x0) * x_scale) for x in xs], [None if y is None else round((y1 - y) * y_scale) for y in ys])
    for r in range(rows):
        text = Text(no_wrap=True, end="")
        said = label(y1) if r == 0 else label(y0) if r == rows - 1 else ""
        text.append(said.rjust(MARGIN)[-MARGIN:] + ("┤" if said else "│"), AXIS)
        text.append("".join(chr(0x2800 + b) if b else " " for b in bits[r]), style)
        lines.append(text)
    return lines


def draw(run: RunState | None, life: Life | None, width: int, height: int, note: str) -> Text:
    """Loss, power and memory over the run's life, one time axis under them."""
    out = Text(no_wrap=True, overflow="crop", end="")
    if life is None:
        out.append((note or "reading the GPU recording…").center(width), TITLE)
        return out
    cols = width - MARGIN - 1
    rows = height - 5  # three titles, the axis and its labels
    loss_rows = max(1, rows - 2 * (rows // 3))
    gpu_rows = max(1, rows // 3)
    steps = [(e.get("time"), number(e.get("loss"))) for e in (run.steps if run is not None else ())]
    steps = [(t, v) for t, v in steps if number(t) is not None and life.start <= t <= life.end]
    x0, x1 = life.start, life.end
    where = f"{life.cards} GPU{'s' if life.cards != 1 else ''} of the host, summed"
    out.append(" " * (MARGIN + 1) + "loss by time" + ("" if steps else " (no step events with times)"), TITLE)
    for line in band([t for t, _ in steps], [v for _, v in steps], loss_rows, cols, x0, x1, TOTAL, lambda v: format_number(v, 3)):
        out.append("\n")
        out.append(line)
    spans = list(range(len(life.power_w)))
    xs = [life.at(k) for k in spans]
    limit = f" of {life.limit_w:.0f}" if life.limit_w else ""
    out.append("\n" + " " * (MARGIN + 1))
    out.append(f"power W{limit} ({where}; blank: not recorded)"[:cols], POWER)
    for line in band(xs, list(life.power_w), gpu_rows, cols, x0, x1, POWER, lambda v: f"{v:.0f}"):
        out.append("\n")
        out.append(line)
    total = f" of {life.total_gib:.0f}" if life.total_gib else ""
    out.append("\n" + " " * (MARGIN + 1))
    out.append(f"memory GiB{total}"[:cols], MEMORY)
    for line in band(xs, list(life.mem_gib), gpu_rows, cols, x0, x1, MEMORY, lambda v: f"{v:.0f}"):
        out.append("\n")
        out.append(line)
    out.append("\n" + " " * MARGIN + "└" + "─" * cols, AXIS)
    left, right = time.strftime("%H:%M", time.localtime(x0)), time.strftime("%H:%M", time.localtime(x1))
    out.append("\n" + " " * (MARGIN + 1) + left + right.rjust(max(0, cols - len(left))), AXIS)
    return out


class GpuLife(Guarded, Widget):
    """Drawn from the run and the recording the screen's worker read (never read here)."""

    DEFAULT_CSS = f"""
    GpuLife {{
        display: none;  /* the run screen's `g` shows it in the loss chart's place */
        width: 1fr;
        height: 1fr;
        min-height: {MIN_SIZE[1]};
    }}
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.run: RunState | None = None
        self.recording = None
        self.start = self.end = 0.0
        self.note = ""

    def show(self, run: RunState | None, recording, start: float, end: float, note: str = "") -> None:
        self.run, self.recording, self.start, self.end, self.note = run, recording, start, end, note
        self.refresh()

    def render(self) -> RenderResult:
        width, height = self.size
        if width < MIN_SIZE[0] or height < MIN_SIZE[1]:
            return ""
        cols = width - MARGIN - 1
        life = life_of(self.recording, self.start, max(self.end, self.start + 1), 2 * cols) if self.recording is not None else None
        return draw(self.run, life, width, height, self.note)
