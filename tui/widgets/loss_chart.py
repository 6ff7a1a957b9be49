"""The loss chart: the total and one curve per TTT step, EMA-smoothed, linear or log y."""

from __future__ import annotations

import math
import time

from rich.text import Text
from textual.app import RenderResult
from textual.timer import Timer
from textual_plotext import PlotextPlot

from tui.state import RunState, ema

MIN_SIZE = (24, 8)  # columns, rows below which there is no chart worth drawing
REPLOT_S = 0.5
MAX_POINTS = 400  # plotted per curve; longer histories are thinned evenly


class LossChart(PlotextPlot):
    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.smoothing = 0.3  # EMA weight of the newest point; 1.0 shows raw values
        self.log_y = False
        self.run: RunState | None = None
        self._last = 0.0  # monotonic time of the last replot
        self._pending: Timer | None = None

    def show(self, run: RunState | None) -> None:
        """Plot `run`; at most every REPLOT_S (a plot costs tens of ms), the latest data last."""
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
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        scale = "log" if self.log_y else "linear"
        plt.title(f"loss (EMA {self.smoothing:g}, {scale} y)")
        plt.xlabel("step")
        run = self.run
        if run is not None and run.steps:
            events = list(run.steps)
            steps = [e.get("step", i) for i, e in enumerate(events)]
            ttt = [e.get("loss_ttt") or () for e in events]
            for k in range(max(map(len, ttt), default=0)):
                self._curve(steps, [losses[k] if k < len(losses) else None for losses in ttt], f"ttt {k}")
            self._curve(steps, [e.get("loss") for e in events], "total")
        elif run is not None and run.console_loss:
            steps, values = zip(*run.console_loss)
            self._curve(list(steps), list(values), "loss")
        plt.yscale(scale)
        self.refresh()

    def _curve(self, steps: list, values: list, label: str) -> None:
        floor = 0.0 if self.log_y else -math.inf
        smoothed = ema(values, self.smoothing)
        # Indices, not (step, value) pairs: thousands of tuples a replot set off the
        # garbage collector's full passes, tens of ms that land on a key's repaint.
        kept = [i for i, v in enumerate(smoothed) if v > floor and math.isfinite(v)]
        if not kept:
            return
        kept = kept[:: math.ceil(len(kept) / MAX_POINTS)]
        self.plt.plot([steps[i] for i in kept], [smoothed[i] for i in kept], label=label, marker="braille")

    def render(self) -> RenderResult:
        # plotext indexes past its canvas when the widget is tiny (a maximized log shrinks
        # it to nothing) or the data are odd; a chart is never worth a crash.
        if self.size.width < MIN_SIZE[0] or self.size.height < MIN_SIZE[1]:
            return ""
        try:
            return super().render()
        except Exception as error:
            return Text(f"loss chart unavailable: {error!r}", style="dim")

    def toggle_log(self) -> None:
        self.log_y = not self.log_y
        self.replot()

    def cycle_smoothing(self) -> None:
        options = [1.0, 0.3, 0.1, 0.03]
        self.smoothing = options[(options.index(self.smoothing) + 1) % len(options)] if self.smoothing in options else 0.3
        self.replot()
