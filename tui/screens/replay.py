"""`trackside replay`: the run screen as it was at a moment, stepped through time.

What it draws is the run screen's own (its GPU panel, stats, loss chart and log), fed
with the run as backends/history says it stood then: the events written by then, the log
cut where the recording says it ended then, the host's GPUs then (a gap in the recording
is said, never filled). It only reads: no key here acts on the run, and the screen says so.
"""

from __future__ import annotations

import time
from collections import deque

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widgets import Static

from backends import sanitize
from backends.gpu import GpuReading, GpuSnapshot, GpuStatus
from backends.history import Frame, History, Moment, frame_at
from backends.history.when import stamp
from backends.runs import RunInfo, RunPhase
from tui.guard import Guarded
from tui.inert import inert
from tui.screens.run import stats_text
from tui.widgets.run_log import RunLog
from tui.state import HISTORY, LOG_LINES, GpuTrace, HostState, HostStatus, RunState, format_duration
from tui.widgets.footer import Footer
from tui.widgets.gpu_panel import GpuPanel
from tui.widgets.loss_chart import LossChart
from tui.widgets.title_bar import TitleBar

STEP_S = 60.0  # ←/→ (shift: ten of them)
SAME_S = 1e-3  # a moment this near is the one shown (a fast run's steps are milliseconds apart)
READ_ONLY = "read-only: no key acts on the run"
# Each moment's mark on the time line, and its colour there and in the moments' line.
MARKS = {"start": ("▲", "green"), "end": ("■", "dim"), "exit": ("■", "bold"), "stop": ("✕", "yellow"),
         "relaunch": ("↻", "cyan"), "gap": ("┊", "magenta"), "stall": ("!", "yellow"), "underfed": ("▽", "yellow")}  # fmt: skip
ALERT_MARK = ("!", "bold red")  # an alert's (oom, nan, jump, skipping, failed, nonfinite)


def run_at(history: History, frame: Frame) -> RunState:
    """The run as the run screen's widgets read one, at the frame's moment."""
    ended = frame.ended
    info = RunInfo(history.run_id, history.session, history.host, RunPhase.EXITED if ended else RunPhase.RUNNING,
                   exit_status=history.exit_status if ended else None, params=dict(history.params), parent=history.parent,
                   console=frame.console, session_open=not ended)  # fmt: skip
    run = RunState(f"{history.host}/{history.name}", history.host, info)
    for event in frame.events:
        run.add_event(event)
    run.garbled = history.garbled
    run.log.extend(frame.log.lines[-LOG_LINES:])
    return run


def host_at(history: History, frame: Frame) -> HostState:
    """The run's host's GPUs at the frame's moment, from the recording (a gap: none)."""
    host = HostState(history.host, HostStatus.OK)
    readings = []
    for card in frame.gpus:
        if card.sample is None:
            continue
        s = card.sample
        readings.append(GpuReading(card.index, uuid=s.uuid, power_w=s.power_w, power_limit_w=s.power_limit_w,
                                   mem_used_mib=_whole(s.mem_used_mib), mem_total_mib=_whole(s.mem_total_mib),
                                   util_pct=_whole(s.util_pct)))  # fmt: skip
        host.traces[card.index] = GpuTrace(deque(card.power_w, maxlen=HISTORY), deque(card.mem_mib, maxlen=HISTORY))
    if readings and not frame.gpu_note:
        host.gpus = GpuSnapshot(GpuStatus.OK, gpus=tuple(readings), time=frame.time)
    else:
        host.gpus = GpuSnapshot(GpuStatus.ERROR, frame.gpu_note or "no reading", time=frame.time)
    return host


def _whole(value: float | None) -> int | None:
    return None if value is None else round(value)


def timeline(history: History, moments: list[Moment], when: float, width: int) -> Text:
    """The run's life as a line of `width` cells: its moments marked, `when` as ●."""
    span = max(1e-9, history.end - history.start)
    cells = max(1, width - 2)
    line = [("─", "dim")] * cells
    for m in moments:
        c = min(cells - 1, max(0, round((m.time - history.start) / span * (cells - 1))))
        line[c] = MARKS.get(m.kind, ALERT_MARK)
    c = min(cells - 1, max(0, round((when - history.start) / span * (cells - 1))))
    line[c] = ("●", "bold reverse")
    text = Text("├", style="dim")
    for mark, style in line:
        text.append(mark, style)
    text.append("┤", style="dim")
    return text


class ReplayScreen(Guarded, Screen):
    AUTO_FOCUS = "#log"
    # Priority: the focused log would take ←/→ and Home/End to scroll; here they move time.
    BINDINGS = [
        Binding("left", "move(-1)", "−1 min", id="trackside.replay.back", tooltip="A minute earlier", priority=True),
        Binding("right", "move(1)", "+1 min", id="trackside.replay.on", tooltip="A minute later", priority=True),
        Binding("shift+left", "move(-10)", "−10 min", show=False, id="trackside.replay.back_far", priority=True),
        Binding("shift+right", "move(10)", "+10 min", show=False, id="trackside.replay.on_far", priority=True),
        Binding("comma", "step(-1)", "Step", key_display=",", id="trackside.replay.step_back", tooltip="The step before"),
        Binding("full_stop", "step(1)", "Step", key_display=".", show=False, id="trackside.replay.step_on"),
        Binding("p", "moment(-1)", "Prev", id="trackside.replay.previous", tooltip="The moment that mattered before this"),
        Binding("n", "moment(1)", "Next", id="trackside.replay.next", tooltip="The next moment that mattered"),
        Binding("m", "moments", "Moments", id="trackside.replay.moments", tooltip="Every moment that mattered, to go to one"),
        Binding("home", "edge(0)", "Start", show=False, id="trackside.replay.start", priority=True),
        Binding("end", "edge(1)", "End", show=False, id="trackside.replay.end", priority=True),
        Binding("y", "log_scale", "Log/lin y", show=False, id="trackside.replay.log_scale"),
        Binding("s", "smoothing", "Smoothing", show=False, id="trackside.replay.smoothing"),
        Binding("x", "x_axis", "Step/tokens", show=False, id="trackside.replay.x_axis"),
        Binding("q,escape", "app.quit", "Quit", id="trackside.replay.quit"),
    ]

    def __init__(self, history: History, moments: list[Moment], when: float) -> None:
        super().__init__()
        self.history, self.moments = history, moments
        self.when = when
        self.frame: Frame | None = None
        self.steps = history.step_times() or (list(history.tape.times) if history.tape is not None else [])

    def compose(self) -> ComposeResult:
        yield TitleBar()
        yield Static(id="when")
        with Horizontal(id="top"):
            yield GpuPanel(id="gpus")
            yield Static(id="stats")
        yield LossChart(id="loss")
        yield RunLog(id="log")
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = sanitize.line(f"replay {self.history.name} on {self.history.host}")
        self.show_moment()

    def on_resize(self) -> None:
        self._show_when()

    def show_moment(self) -> None:
        history = self.history
        self.frame = frame = frame_at(history, self.when, log_lines=LOG_LINES, history_samples=HISTORY)
        run = run_at(history, frame)
        self.query_one(GpuPanel).show([(host_at(history, frame), False)])
        self.query_one("#stats", Static).update(inert(stats_text(run, self.when)))
        self.query_one(LossChart).show(run)
        log = self.query_one(RunLog)
        log.clear()
        log.write_lines(list(run.log))
        log.scroll_end(animate=False, immediate=True, x_axis=False)
        log.border_title = sanitize.line(frame.log.note) if frame.log.note else None
        self._show_when()

    def _show_when(self) -> None:
        history, when = self.history, self.when
        bar = self.query_one("#when", Static)
        width = max(10, bar.size.width or self.app.size.width)
        text = Text()
        text.append(f"{stamp(when)}", style="bold")
        text.append(f" +{format_duration(when - history.start)}/{format_duration(history.end - history.start)}")
        text.append(" ended" if self.frame and self.frame.ended else "", style="dim")
        text.append(f"  {READ_ONLY}\n", style="italic yellow")
        text.append(timeline(history, self.moments, when, width))
        here = [m for m in self.moments if abs(m.time - when) < SAME_S]
        before = [m for m in self.moments if m.time < when - SAME_S]
        after = [m for m in self.moments if m.time > when + SAME_S]
        # At a moment, it alone, whole; between two, each its half.
        said = [("now", Moment(here[0].time, here[0].kind, " · ".join(m.text for m in here)))] if here else [*([("p", before[-1])] if before else []), *([("n", after[0])] if after else [])]
        text.append("\n")
        room = max(8, (width - 2) // max(1, len(said)))  # each its share of the line, cut
        for key, moment in said:
            text.append(self._said(key, moment, room))
        if not self.moments:
            text.append("no moment that mattered: no alert, stop or relaunch", style="dim")
        bar.update(inert(text))

    @staticmethod
    def _said(key: str, moment: Moment, room: int) -> Text:
        mark, style = MARKS.get(moment.kind, ALERT_MARK)
        text = Text.assemble((f"[{key}] ", "dim"), (f"{mark} {time.strftime('%H:%M:%S', time.localtime(moment.time))} ", style),
                             moment.text)  # fmt: skip
        text.truncate(room - 2, overflow="ellipsis")
        text.append("  ")
        return text

    def go(self, when: float) -> None:
        self.when = min(self.history.end, max(self.history.start, when))
        self.show_moment()

    def action_move(self, minutes: int) -> None:
        self.go(self.when + minutes * STEP_S)

    def action_step(self, direction: int) -> None:
        times = self.steps
        if direction > 0:
            later = [t for t in times if t > self.when]
            self.go(later[0] if later else self.history.end)
        else:
            earlier = [t for t in times if t < self.when]
            self.go(earlier[-1] if earlier else self.history.start)

    def action_moment(self, direction: int) -> None:
        if direction > 0:
            found = next((m for m in self.moments if m.time > self.when + SAME_S), None)
        else:
            found = next((m for m in reversed(self.moments) if m.time < self.when - SAME_S), None)
        if found is None:
            self.notify("no moment that mattered " + ("after" if direction > 0 else "before") + " this one", timeout=4)
            return
        self.go(found.time)

    def action_moments(self) -> None:
        from tui.screens.pick_moment import PickMoment

        if not self.moments:
            self.notify("no moment that mattered: no alert, stop or relaunch", timeout=4)
            return
        near = max(0, sum(1 for m in self.moments if m.time <= self.when + SAME_S) - 1)
        marks = [MARKS.get(m.kind, ALERT_MARK) for m in self.moments]
        self.app.push_screen(PickMoment(self.moments, self.history.start, marks, near),
                             lambda when: self.go(when) if when is not None else None)  # fmt: skip

    def action_edge(self, end: int) -> None:
        self.go(self.history.end if end else self.history.start)

    def action_log_scale(self) -> None:
        self.query_one(LossChart).toggle_log()

    def action_smoothing(self) -> None:
        self.query_one(LossChart).cycle_smoothing()

    def action_x_axis(self) -> None:
        self.query_one(LossChart).toggle_x()
