"""One run: its GPUs, its loss, its speed, its phase and its log."""

from __future__ import annotations

import time

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Input, Log, Static

from backends import pace, sanitize
from backends.runs import launcher_code
from backends.runs.status import RunStatus
from training.contract import STEP
from tui import energy
from tui.curves import positions_shown
from tui.guard import Guarded
from tui.inert import inert
from tui.state import RunState, format_duration, format_number, node_label
from tui.widgets.alert_bar import AlertBar
from tui.widgets.footer import Footer
from tui.screens.run_life import GpuLife, LifeToggle
from tui.screens.taken_down import TakenDown
from tui.widgets.gpu_panel import GpuPanel
from tui.widgets.loss_chart import LossChart
from tui.widgets.run_log import RunLog
from tui.widgets.title_bar import TitleBar

LOG_LINES = 2000  # shown; rewritten down to half when full
# The window tokens/s and the ETA are measured over, in a no-break space: on a narrow
# screen the whole of it wraps, never "(60" above "s)".
PACE_SAID = f"({pace.WINDOW_LABEL})".replace(" ", "\u00a0")
TOP_MIN = 3  # the GPUs-and-stats band's lines however short the terminal (it scrolls the rest)

SHOWN = ("max_seq_len", "ttt_steps", "lr", "batch_rows", "steps")
DFLASH_SHOWN = ("max_seq_len", "block_size", "max_anchors", "soft_kl", "lr", "batch_rows", "steps")


def acceptance(acc_pos) -> str:
    """A DFlash block's accuracy at the positions its chart draws: `acc pos 1/8/15: 0.79 0.55 0.3`."""
    if not isinstance(acc_pos, (list, tuple)) or not acc_pos:
        return ""
    items = positions_shown(len(acc_pos))
    return (f"acc pos {'/'.join(str(i + 1) for i in items)}: "
            + " ".join(format_number(acc_pos[i], 2) for i in items))


def stats_text(run: RunState, now: float) -> Text:
    info = run.info
    params = run.params
    text = Text()
    text.append(f"{run.key}", style="bold")
    text.append(f"  tmux {info.session}\n", style="dim")
    text.append("state ")
    text.append(run.status.label, style=run.style)  # the exit code follows
    status = run.end.get("status") if run.end else None
    if run.end:
        text.append(f" ({status or ''})")
    code = info.exit_status
    if code is not None:
        if launcher_code(status, code):  # a footnote, not the run's failure
            text.append(f" launcher exit {code}", style="dim")
        else:
            text.append(f" exit {code}")
    text.append("\n")
    if len(info.nodes) > 1:
        nodes_text(text, run)
    shown = [k for k in (DFLASH_SHOWN if run.is_dflash else SHOWN) if k in params]
    text.append("  ".join(f"{k} {format_number(params[k])}" for k in shown) + "\n", style="cyan")
    last = run.last or {}
    text.append(f"{run.x_word} {run.step_text}\n")
    # tokens/s and the ETA reckoned over one window of step events, said where they are
    # (a console's ETA is its bar's own); two spaces apart, to fit the stats' column.
    text.append(f"loss {format_number(run.loss)}  tokens/s {format_number(run.tokens_per_s)}  ETA {format_duration(run.eta_s())}")
    if run.steps and run.status is RunStatus.RUNNING:
        text.append(f"  {PACE_SAID}", style="dim")
    text.append("\n")
    if run.console.eval_loss is not None and not run.steps:
        # Dated only when the curve's last point is this evaluation (one the fold could not
        # place yet is not the one before it) and the curve's x is a count the library
        # printed, not the losses' order.
        curve = run.console.eval_curve
        dated = curve and curve[-1][1] == run.console.eval_loss and run.console.axis != "point"
        at = curve[-1][0] if dated else None
        text.append(f"eval loss {format_number(run.console.eval_loss)}"
                    + (f" at {run.x_word} {at}" if at is not None else "") + "\n")
    if info.run_id is None and not info.this_dashboard:
        if info.recorded_since:
            since = time.strftime("%Y-%m-%d %H:%M", time.localtime(info.recorded_since))
            text.append(f"pane {info.pane}, every line since {since}\n", style="dim")
        elif info.pane is not None:
            text.append(f"pane {info.pane}, its screen only (piped elsewhere)\n", style="yellow")
    if run.tau is not None:  # the tokens a block is expected to have accepted
        text.append(f"τ {format_number(run.tau, 3)}", style="bold")
        text.append(f"   {acceptance(last.get('acc_pos'))}\n")
    if (first := run.first_step_s()) is not None:
        phases = f": {said}" if (said := run.startup_said()) else ""
        text.append(f"first step {first[0]:.1f} s after its process started (start event at {first[1]:.1f} s{phases})\n", style="dim")
    if run.steps:
        text.append(
            f"samples/row {format_number(last.get('samples_per_row'), 3)}   pad {format_number(last.get('pad_frac'), 2)}"
            f"   peak {format_number(last.get('peak_mem_gib'), 3)} GiB\n"
        )
        ranks = last.get("peak_mem_gib_ranks")
        if isinstance(ranks, (list, tuple)) and len(ranks) > 1:  # torchrun: every rank's own GPU
            text.append("peak GiB by rank  ")
            text.append("  ".join(f"{rank}:{format_number(gib, 3)}" for rank, gib in enumerate(ranks)) + "\n")
    elif run.progress is not None and run.status is RunStatus.RUNNING:  # the console's bar is the clock (foreign runs, loading)
        p = run.progress
        eta = f", ETA {format_duration(p.eta_s)}" if p.eta_s is not None else ""
        label = f"  {p.label}" if p.label else ""
        text.append(f"{p.phase}: {p.done}/{p.total} {p.fraction:.0%}{eta}{label}\n", style="yellow")
    text.append(energy.line(run), style="dim")
    if run.garbled:
        text.append(f"{run.garbled} unreadable metrics lines skipped\n", style="yellow")
    if run.gone and info.run_id is not None:
        text.append("run directory is gone (deleted or unreadable)\n", style="red")
    elif run.gone:
        text.append(f"tmux session {info.session} is gone\n", style="dim")
    return text


def nodes_text(text: Text, run: RunState) -> None:
    """A multi-node run's nodes: each one's host, state and PIDs, as its own host lists them."""
    for node in run.info.nodes:
        label, style = node_label(node, run.info.end_status)
        text.append(f"node {node.node} {node.host}  ", style="dim")
        text.append(label, style=style)
        text.append(f"  PIDs {' '.join(map(str, node.pids))}\n" if node.pids else "\n", style="dim")


class LogPane(Vertical):
    """The log with its filter: `l` fills the screen with both, so a filter opened over
    the full log is in sight."""

    ALLOW_MAXIMIZE = True
    DEFAULT_CSS = "LogPane { height: 1fr; min-height: 3; }"  # its border and two lines on a short terminal


class RunScreen(TakenDown, LifeToggle, Guarded, Screen):
    AUTO_FOCUS = "#log"
    # Escape is the back binding's: it clears a filter before it shrinks the full log.
    ESCAPE_TO_MINIMIZE = False
    composed = False  # the app may report changes between push and compose
    console_shown: tuple = (None, None)  # progress and console loss the stats last showed
    stats_shown: Text | None = None
    stats_height = 0  # lines the stats took at their last layout
    top_cap: int | None = None  # the GPUs' band's height cap, as _fit_top last set it
    gpu_lines = 0  # the lines the run's GPUs took at their last showing
    # The log's offset when a write last left it at its end: still there at the next
    # write, nobody scrolled, and the log follows even if a layout change shrank it.
    log_end_y: float | None = None

    BINDINGS = [
        Binding("y", "log_scale", "Log/lin y", id="trackside.run.log_scale", tooltip="Loss axis: logarithmic or linear"),
        Binding("s", "smoothing", "Smoothing", id="trackside.run.smoothing", tooltip="Smooth the loss curve more, then not at all"),
        Binding("x", "x_axis", "Step/tokens", id="trackside.run.x_axis", tooltip="Loss by step or by tokens seen"),
        Binding("o", "overlay", "Overlay", id="trackside.run.overlay", tooltip="Draw another run's loss behind this one's"),
        Binding("g", "gpu_life", "GPU life", id="trackside.run.gpu_life", tooltip="The run's whole life by time: loss, and its host's GPUs' power and memory from the recording"),
        Binding("escape", "back", "Fleet", id="trackside.run.back", tooltip="Back to the fleet of hosts and runs"),
    ]

    def __init__(self, run_key: str | None, *, waiting: str = "", focus_log: bool = False) -> None:
        super().__init__()
        self.run_key = run_key
        self.waiting = waiting
        self.focus_log = focus_log
        self.log_filter = ""

    def compose(self) -> ComposeResult:
        yield TitleBar()
        yield AlertBar(id="alerts")
        with Horizontal(id="top"):
            yield GpuPanel(id="gpus")
            yield Static(id="stats")
        yield LossChart(id="loss")
        yield GpuLife(id="life")
        with LogPane():
            yield Input(placeholder="show only log lines containing… (Esc clears)", id="log-filter")
            yield RunLog(id="log")
        yield Footer()

    def on_mount(self) -> None:
        if self.taken_down():
            return
        self.composed = True
        # The stylesheet's cap on the GPUs-and-stats band, which a run spanning hosts may
        # outgrow (_fit_top).
        self.top_lines = self.query_one("#top").styles.max_height.cells or 0
        self.query_one("#log-filter").display = False
        self.show_run(self.run_key)
        if self.focus_log:
            self._toggle_log_focus()

    def on_screen_resume(self) -> None:
        self.state_changed()

    def on_unmount(self) -> None:
        self.composed = False
        if self.run_key:
            self.app.deselect(self.run_key)

    def selected_run_key(self) -> str | None:
        return self.run_key

    @property
    def run(self) -> RunState | None:
        return self.app.runs.get(self.run_key) if self.run_key else None

    def show_waiting(self, message: str) -> None:
        self.waiting = message
        self._show_stats(Text(message))

    def show_run(self, key: str | None) -> None:
        """Show `key` (a relaunch switches the screen to the new run)."""
        if self.run_key and self.run_key != key:
            self.app.deselect(self.run_key)
        self.run_key = key
        self.sub_title = sanitize.line(key or "")
        self.query_one(Log).clear()
        run = self.run
        if run is not None:
            self._write_log(list(run.log))
        self.query_one(LossChart).show(run)
        self.state_changed()
        self.app.refresh_bindings()
        if run is not None:
            self.app.read_overlays(run.key)  # its ancestors' curves, behind its own

    def state_changed(self, *, host=None, run=None, events=(), lines=()) -> None:
        if not self.composed:
            return
        app = self.app
        bar = self.query_one(AlertBar)
        before = bar.shown
        bar.show(list(app.alerts.values()))
        if bar.shown is not before:  # its height is known once it is laid out
            self.call_after_refresh(self._fit_top)
        current = self.run
        if current is None:
            self._show_stats(Text(self.waiting))
            return
        everything = host is None and run is None  # the once-a-second tick, or a resume
        ours = host in current.hosts  # a multi-node run: any of its nodes' hosts
        if everything or ours:
            # Every GPU of every host it runs on (watched: a node on a host not in the
            # config has no GPU reading here).
            shown = [name for name in current.hosts if name in app.hosts]
            self._fit_top(self.query_one(GpuPanel).show([(app.hosts[name], app.watched[name].host.is_local) for name in shown]))
            app.refresh_bindings()  # a listing may have ended the run: k no longer applies
        # Console lines change the stats only through progress or a console loss.
        console = (current.progress, current.console_loss[-1] if current.console_loss else None)
        if everything or ours or (run == current.key and (events or console != self.console_shown)):
            self.console_shown = console
            self._show_stats(stats_text(current, app.clock()))
        if run == current.key:
            if any(e.get("event") == STEP for e in events):
                self.query_one(LossChart).show(current)
            if lines:
                self._write_log(lines)

    def on_resize(self, event: events.Resize) -> None:
        self.call_after_refresh(self._fit_top)

    def _fit_top(self, lines: int | None = None) -> None:
        """Let the GPUs' band grow past the stylesheet's cap, up to half the screen, when
        the run's GPUs need it (two hosts of eight are sixteen lines); hold it under the
        cap on a short terminal, where the chart's least (its legends, curves and axis) and
        the log's come first: 80×24 scrolled the whole screen, the chart's axis out of
        sight. What the band cannot show, it scrolls."""
        if lines is not None:
            self.gpu_lines = lines
        if self.taken_down():  # called after the refresh that followed a resize, and Escape took the widgets down first
            return
        wanted = max(self.top_lines, min(self.gpu_lines, self.size.height // 2))
        fixed = sum(w.outer_size.height for w in (self.query_one(TitleBar), self.query_one(AlertBar), self.query_one(Footer)) if w.display)
        least = sum(w.styles.min_height.cells or 0 for w in (self.query_one(LossChart), self.query_one(LogPane)))
        cap = max(TOP_MIN, min(wanted, self.size.height - fixed - least))
        if cap != self.top_cap:
            self.query_one("#top").styles.max_height = cap
            self.top_cap = cap

    def _show_stats(self, text: Text) -> None:
        """Update the stats, with a layout pass (which reflows and repaints the whole
        screen) only when their height changes: a step changes numbers, rarely lines."""
        stats = self.query_one("#stats", Static)
        text = inert(text)  # names, params, a bar's label: anyone's
        if text == self.stats_shown:
            return
        height = len(text.wrap(self.app.console, max(1, stats.content_size.width)))
        stats.update(text, layout=height != self.stats_height)
        self.stats_shown, self.stats_height = text, height

    def _write_log(self, lines: list[str]) -> None:
        """Append lines; past LOG_LINES, start again from the newest half.

        Textual's own Log(max_lines=…) keeps showing pruned lines from its render cache, so
        the bound is kept here, by rewriting, which happens once per LOG_LINES/2 lines.
        """
        log = self.query_one(Log)
        needle = self.log_filter
        shown = [line for line in lines if needle in line] if needle else list(lines)
        if log.line_count + len(shown) > LOG_LINES:
            kept = [line for line in self.run.log if needle in line] if self.run else shown
            log.clear()
            shown = kept[-LOG_LINES // 2 :]
        if shown:
            # Textual's Log follows only while scrolled to its end; shrunk by a layout
            # change (the stats gaining a line, a smaller terminal) it is left short of it.
            follow = log.is_vertical_scroll_end or log.scroll_y == self.log_end_y
            log.write_lines(shown, scroll_end=False)
            if follow:
                log.scroll_end(animate=False, immediate=True, x_axis=False)
        self.log_end_y = log.scroll_y if log.is_vertical_scroll_end else None

    def action_log_focus(self) -> None:
        self._toggle_log_focus()

    def _toggle_log_focus(self) -> None:
        log = self.query_one(Log)
        log.focus()
        if self.maximized is not None:
            self.minimize()
        else:
            self.maximize(log)

    def action_filter(self) -> None:
        box = self.query_one("#log-filter", Input)
        box.display = True
        box.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        self.log_filter = event.value
        log = self.query_one(Log)
        log.clear()
        if self.run is not None:
            self._write_log(list(self.run.log))
        # The Log follows new lines only while scrolled to its end, and a refill keeps
        # the old offset: back to the end, so it follows as before the filter.
        log.scroll_end(animate=False, immediate=True, x_axis=False)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.query_one(Log).focus()

    def action_log_scale(self) -> None:
        self.query_one(LossChart).toggle_log()

    def action_smoothing(self) -> None:
        self.query_one(LossChart).cycle_smoothing()

    def action_x_axis(self) -> None:
        self.query_one(LossChart).toggle_x()

    def action_overlay(self) -> None:
        from tui.screens.pick_run import PickRun

        current = self.run
        # Not the dashboard's own session: its pane prints other runs' numbers.
        others = [run for key, run in self.app.runs.items()
                  if (current is None or key != current.key) and not run.info.this_dashboard]  # fmt: skip
        if current is None or not others:
            self.notify("no other run in the fleet to draw behind this one", timeout=5)
            return

        def picked(key: str | None) -> None:
            if key is not None:
                self.app.read_overlays(current.key, key)

        self.app.push_screen(PickRun(current.key, others, set(current.overlays)), picked)

    def action_back(self) -> None:
        box = self.query_one("#log-filter", Input)
        if box.display:
            box.value = ""
            box.display = False
            return
        if self.maximized is not None:
            self.minimize()
            return
        # pop_screen pops the top screen: only while that is this one (a queued Escape
        # may arrive after the screen was left).
        if self.app.screen is self and len(self.app.screen_stack) > 2:
            self.app.pop_screen()
