"""What the dashboard knows about hosts and runs: plain data, updated from monitor messages.

Widgets render from this state and never fetch anything themselves. Every buffer is
bounded so that a run that logs for days keeps the app's memory flat.
"""

from __future__ import annotations

import enum
import math
from collections import deque
from dataclasses import dataclass, field

from backends.alerts import format_duration  # the alerts' texts and the screens read durations alike
from backends import pace, runs
from backends.gpu import GpuSnapshot
from backends.logs.console import ConsoleSummary
from backends.logs.logparse import Progress
from backends.logs.record import MetricsRecord
from backends.runs.status import RunStatus, node_words, status_of, status_words

HISTORY = 120  # GPU samples kept per card (two minutes at 1 Hz)
STEP_HISTORY = 5000  # step events kept per run for the loss chart
LOG_LINES = 2000  # console lines kept per run
# Where a DFlash run's start event holds each knob its edit form offers: the flags default
# to the preset's values, so its argv alone may not say them.
DFLASH_KNOBS = {
    "block_size": ("model", "block_size"),
    "max_anchors": ("dflash", "max_anchors"),
    "dflash_gamma": ("dflash", "gamma"),
    "soft_kl": ("dflash", "soft_kl"),
}


def run_key(host: str, run: runs.RunInfo) -> str:
    """A run's identity across polls: its run id, or its tmux session for foreign runs."""
    return f"{host}/{run.run_id or run.session}"


def node_label(node: runs.NodeInfo, end_status: str | None) -> tuple[str, str]:
    """One node of a multi-node run in a few words, with its colour: red only for a node
    that died."""
    words, status = node_words(node.state, node.exit_status, end_status)
    return words, STYLES[status]


# A count that is not steps, as a narrow column abbreviates what it counts.
X_SHORT = {"round": "rd", "epoch": "ep", "n_updates": "upd"}

class HostStatus(enum.StrEnum):
    """Whether the dashboard reaches a host. A str enum: the monitor reports the word."""

    CONNECTING = "connecting"
    OK = "ok"
    OFFLINE = "offline"
    AUTH = "auth"  # reached, but our keys were refused
    ERROR = "error"

    @property
    def lost(self) -> bool:
        return self in (HostStatus.OFFLINE, HostStatus.AUTH, HostStatus.ERROR)

    @property
    def style(self) -> str:
        return "bold red" if self.lost else "green" if self is HostStatus.OK else "dim"


# Each status's colour on every screen: failures red, a clean end not.
STYLES = {
    RunStatus.RUNNING: "green",
    RunStatus.FINISHED: "dim green",
    RunStatus.STOPPED: "dim",
    RunStatus.FAILED: "bold red",
    RunStatus.KILLED: "bold red",
    RunStatus.OOM: "bold red",
    RunStatus.UNKNOWN: "yellow",
    RunStatus.GONE: "dim strike",
    RunStatus.EXITED: "dim",  # its program returned to its shell: ended, no failure said
    RunStatus.UNREADABLE: "yellow",
    RunStatus.STOP_INTERRUPTED: "bold yellow",
    RunStatus.NONFINITE: "bold red",
}


@dataclass
class GpuTrace:
    power_w: deque = field(default_factory=lambda: deque(maxlen=HISTORY))
    mem_mib: deque = field(default_factory=lambda: deque(maxlen=HISTORY))
    underfed_since: float | None = None


@dataclass
class HostState:
    name: str
    status: HostStatus = HostStatus.CONNECTING
    message: str = ""
    last_ok: float | None = None
    gpus: GpuSnapshot | None = None  # the latest
    traces: dict[int, GpuTrace] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.status = HostStatus(self.status)  # given as its word, it reads as the enum

    def stale_for(self, now: float, interval: float) -> float | None:
        """Seconds since the last good poll, once that is well past the poll interval."""
        if self.last_ok is None:
            return None
        age = now - self.last_ok
        return age if age > 3 * interval else None


@dataclass
class RunState:
    key: str
    host: str
    info: runs.RunInfo
    # Its metrics.jsonl, as followed (backends/logs/record.py: the listing's fold too).
    metrics: MetricsRecord = field(default_factory=lambda: MetricsRecord(STEP_HISTORY))
    # What its followed console.log said, until a listing has read it: a run without step
    # events (a foreign session's panes, or a program of ours) has its listing's instead
    # (`console`), read whether or not it is followed.
    own_console: ConsoleSummary = field(default_factory=ConsoleSummary)
    log: deque = field(default_factory=lambda: deque(maxlen=LOG_LINES))
    garbled: int = 0
    gone: bool = False  # the run no longer appears in the host's listing
    gone_since: float | None = None  # the listing's time when it first did not
    # Run key → backends.logs.series.Overlay: other runs drawn dim behind this one's loss (its
    # ancestors, runs picked from the fleet); replaced whole, never changed in place.
    overlays: dict = field(default_factory=dict)
    stopped_here: bool = False  # stopped by a kill from this dashboard
    # Host → its recording's charge to this run (backends.recorder.energy.Charge), or why
    # there is none, as (a short word, the words): tui/energy.py says it.
    energy: dict = field(default_factory=dict)
    # The host whose fleet row lists it, named by its key. `host` is where its metrics
    # are read: for a multi-node run the node holding rank 0, which the rendezvous picks
    # and the listing finds only once rank 0 has written; `home` stays its first node's.
    home: str = ""

    def __post_init__(self) -> None:
        self.home = self.home or self.host

    @property
    def steps(self) -> deque:
        return self.metrics.steps

    @property
    def start(self) -> dict | None:
        return self.metrics.start

    @property
    def oom(self) -> dict | None:
        return self.metrics.oom

    @property
    def end(self) -> dict | None:
        return self.metrics.end

    @property
    def hosts(self) -> list[str]:
        """Every host it runs on: a multi-node run's nodes', in node order."""
        return [n.host for n in self.info.nodes] or [self.host]

    @property
    def last(self) -> dict | None:
        return self.steps[-1] if self.steps else None

    @property
    def console(self) -> ConsoleSummary:
        """What the run printed said, as every listing reads it (a foreign session's recorded
        panes, a program's console.log), so its row moves whether or not its screen was ever
        open."""
        return self.info.console if self.info.console is not None else self.own_console

    @property
    def progress(self) -> Progress | None:
        """The latest bar or N/M counter followed, else the listing's (a foreign session's)."""
        return self.console.progress or self.info.progress

    @property
    def console_loss(self) -> deque[tuple[int, float]]:
        return self.console.curve

    @property
    def params(self) -> dict:
        """Its launch params, as its start event resolved them; a DFlash run's knobs always
        (its edit form starts from them)."""
        params = dict(self.info.params)
        config = self.metrics.config  # a start event's: anyone's, so only its numbers are taken
        params.update({k: v for k, v in config.items() if k in params and _number(v)})
        if isinstance(config.get("dflash"), dict):
            for key, (section, name) in DFLASH_KNOBS.items():
                part = config.get(section)
                value = part.get(name) if isinstance(part, dict) else None
                if _number(value):
                    params[key] = value
        return params

    @property
    def is_dflash(self) -> bool:
        """A DFlash drafter's run, by what it logged, else by its launch params."""
        config = self.metrics.config
        if isinstance(config.get("dflash"), dict) or (self.last and "loss_pos" in self.last):
            return True
        return any(k in self.info.params for k in (*DFLASH_KNOBS, "num_layers"))

    @property
    def tau(self) -> float | None:
        """A DFlash run's latest expected accepted length per block."""
        tau = self.last.get("tau") if self.last else None
        return tau if isinstance(tau, (int, float)) and not isinstance(tau, bool) else None

    @property
    def step(self) -> int | None:
        if self.last:
            return self.metrics.step
        if self.console.step is not None:
            return self.console.step
        return self.info.last_step

    @property
    def loss(self) -> float | None:
        if self.last:
            return self.metrics.value("loss")
        if self.console.loss is not None:
            return self.console.loss
        return self.info.last_loss

    @property
    def steps_per_epoch(self) -> int | None:
        return self.metrics.steps_per_epoch or self.info.steps_per_epoch

    @property
    def total_steps(self) -> int | None:
        return pace.total_steps(self.start, self.params)

    @property
    def tokens_per_s(self) -> float | None:
        """Over its pace window (backends/pace.py), while it runs: an ended run has no pace."""
        return self.metrics.tokens_per_s() if self.status is RunStatus.RUNNING else None

    def eta_s(self) -> float | None:
        """From the step events' rate; without them, what its console's bars say; none
        once it is not running."""
        if self.status is not RunStatus.RUNNING:
            return None
        if not self.steps:
            return self.console.eta_s
        return self.metrics.eta_s(self.params)

    @property
    def step_counted(self) -> str:
        """The step as a narrow column shows it: the count, and what it counts where that is
        not steps (`40 rd`: LightGBM's round 40)."""
        short = X_SHORT.get(self.x_word)
        return f"{format_number(self.step)} {short}" if short and self.step is not None else format_number(self.step)

    @property
    def x_word(self) -> str:
        """What its step counts: a trainer's steps, or for a run read from its console alone
        the library's own axis (`round`, `epoch`, `n_updates`), as its curves say."""
        axis = self.console.axis
        return "step" if self.last or axis == "point" else axis

    @property
    def step_text(self) -> str:
        """`152 (epoch 1, 48/104)`: the latest step, and where it falls in its epoch, the
        epoch numbered as the trainer numbers it (from 0: its step event's `epoch`, the
        `epoch=` of its log)."""
        step, per_epoch = self.step, self.steps_per_epoch
        if step is None or not per_epoch or step < 1:
            return format_number(step)
        epoch, in_epoch = divmod(step - 1, per_epoch)
        said = self.last.get("epoch") if self.last else None
        if isinstance(said, int) and not isinstance(said, bool) and said != epoch:
            # Its loader is elsewhere than its step count says (a skipped step spends a
            # batch): the trainer's epoch, and no place in it.
            return f"{format_number(step)} (epoch {said})"
        return f"{format_number(step)} (epoch {epoch}, {in_epoch + 1}/{per_epoch})"

    @property
    def status(self) -> RunStatus:
        return status_of(
            self.info, end=(self.end or {}).get("status"), oom=self.oom is not None, gone=self.gone,
            stopped_here=self.stopped_here,
        )  # fmt: skip

    @property
    def style(self) -> str:
        return STYLES[self.status]

    @property
    def state_label(self) -> str:
        """The status in a few words: its label, what ended it, or a loading phase. Our
        trainer's run (it has params) reads `starting` until its start event, then
        `compiling` on a GPU (`first step…` elsewhere) until its first step: the phases of
        a relaunch, as they happen."""
        if (self.status is RunStatus.RUNNING and self.params and not self.steps and self.info.last_step is None
                and self.progress is None):  # a console's own loading bar says more
            if self.start is None:
                return "starting"
            # On a GPU the wait is the compiler's: a new process traces its compiled parts
            # again before the first step (docs/benchmarks.md, "The operator's loop").
            return "compiling" if (self.start.get("config") or {}).get("device") == "cuda" else "first step…"
        return status_words(self.status, self.info.exit_status, None if self.steps else self.progress, self.info.stop)

    def startup_said(self) -> str:
        """Where the start-up's seconds went, from the start event (`imports and CUDA 3.8,
        data 0.0, model 0.4` on a GPU, `imports 3.8, …` on a CPU, a resume's load where there
        was one); empty if it does not say."""
        phases = (self.start or {}).get("startup_s")
        if not isinstance(phases, dict):
            return ""
        # The first phase is the imports and the device's set-up: CUDA's only on a GPU.
        device = self.metrics.config.get("device")
        device_said = {"cuda": "imports and CUDA", "cpu": "imports"}.get(device, f"imports and {device}" if isinstance(device, str) else "imports")
        names = {"imports_device": device_said, "replaced_run": "the run it replaces stopping",
                 "data": "data", "model": "model", "resume": "resume"}
        return ", ".join(f"{names[k]} {v:.1f}" for k, v in phases.items()
                         if k in names and isinstance(v, (int, float)) and (k != "resume" or v > 0))

    def first_step_s(self) -> tuple[float, float] | None:
        """(its first step, its start event) in seconds after its trainer's process started,
        all on the trainer's clock, while the first step of this start is still in the
        history."""
        start = self.start or {}
        began, first = start.get("process_started"), self.steps[0] if self.steps else None
        resumed = (start.get("config") or {}).get("resumed_from_step") or 0
        if not isinstance(began, (int, float)) or first is None or first.get("step") != resumed + 1:
            return None
        try:
            return first["time"] - began, start["time"] - began
        except (KeyError, TypeError):
            return None

    def last_step_time(self) -> float | None:
        return self.last.get("time") if self.last else None

    def reset_streams(self) -> None:
        """Forget what was read from the run's files, before reading them again."""
        self.metrics = MetricsRecord(STEP_HISTORY)
        self.own_console = ConsoleSummary()
        self.log.clear()
        self.garbled = 0

    def add_event(self, event: dict) -> None:
        self.metrics.add(event)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def format_number(value: float | None, digits: int = 4, width: int | None = None) -> str:
    """A number as the screens show it; within `width` characters by giving up digits,
    never by cutting (a column's 7 made 2.43e-12 read 2.43e-1)."""
    if not _number(value):
        return "—"  # none, or not a number (a value read from a file anyone may write)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    text = f"{value:,.0f}" if abs(value) >= 1e4 else f"{value:.{digits}g}"
    while width is not None and len(text) > width and digits > 1:
        digits -= 1
        text = f"{value:.{digits}g}".replace("e+0", "e+").replace("e-0", "e-")
    return text

