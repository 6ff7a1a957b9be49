"""What the dashboard knows about hosts and runs: plain data, updated from monitor messages.

Widgets render from this state and never fetch anything themselves. Every buffer is
bounded so that a run that logs for days keeps the app's memory flat.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

HISTORY = 120  # GPU samples kept per card (two minutes at 1 Hz)
STEP_HISTORY = 5000  # step events kept per run for the loss chart
LOG_LINES = 2000  # console lines kept per run
RATE_WINDOW = 20  # step events used to measure steps/s


def run_key(host: str, run: Any) -> str:
    """A run's identity across polls: its run id, or its tmux session for foreign runs."""
    return f"{host}/{run.run_id or run.session}"


@dataclass
class GpuTrace:
    power_w: deque = field(default_factory=lambda: deque(maxlen=HISTORY))
    mem_mib: deque = field(default_factory=lambda: deque(maxlen=HISTORY))
    underfed_since: float | None = None


@dataclass
class HostState:
    name: str
    status: str = "connecting"  # connecting | ok | offline | auth | error
    message: str = ""
    last_ok: float | None = None
    gpus: Any = None  # the latest backends.gpu.GpuSnapshot
    traces: dict[int, GpuTrace] = field(default_factory=dict)

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
    info: Any  # backends.runs.RunInfo
    start: dict | None = None
    steps: deque = field(default_factory=lambda: deque(maxlen=STEP_HISTORY))
    oom: dict | None = None
    end: dict | None = None
    progress: Any = None  # backends.logparse.Progress of the latest tqdm-style line
    console_loss: deque = field(default_factory=lambda: deque(maxlen=STEP_HISTORY))
    log: deque = field(default_factory=lambda: deque(maxlen=LOG_LINES))
    garbled: int = 0
    gone: bool = False  # the run no longer appears in the host's listing

    @property
    def last(self) -> dict | None:
        return self.steps[-1] if self.steps else None

    @property
    def params(self) -> dict:
        params = dict(getattr(self.info, "params", None) or {})
        if self.start:
            params.update({k: v for k, v in self.start.get("config", {}).items() if k in params})
        return params

    @property
    def step(self) -> int | None:
        if self.last:
            return self.last.get("step")
        return getattr(self.info, "last_step", None)

    @property
    def loss(self) -> float | None:
        if self.last:
            return self.last.get("loss")
        if self.console_loss:
            return self.console_loss[-1][1]
        return getattr(self.info, "last_loss", None)

    @property
    def steps_per_epoch(self) -> int | None:
        if self.start and self.start.get("steps_per_epoch"):
            return self.start["steps_per_epoch"]
        return getattr(self.info, "steps_per_epoch", None)

    @property
    def total_steps(self) -> int | None:
        config = (self.start or {}).get("config", {})
        return config.get("steps") or self.params.get("steps")

    @property
    def tokens_per_s(self) -> float | None:
        return self.last.get("tokens_per_s") if self.last else None

    def steps_per_s(self) -> float | None:
        recent = [e for e in list(self.steps)[-RATE_WINDOW:] if "time" in e]
        if len(recent) < 2:
            return None
        dt = recent[-1]["time"] - recent[0]["time"]
        ds = recent[-1].get("step", 0) - recent[0].get("step", 0)
        return ds / dt if dt > 0 and ds > 0 else None

    def eta_s(self) -> float | None:
        rate, total, step = self.steps_per_s(), self.total_steps, self.step
        if rate is None or total is None or step is None:
            return None
        return max(0.0, (total - step) / rate)

    @property
    def state_label(self) -> str:
        if self.gone:
            return "gone"
        if self.oom:
            return "OOM"
        state = getattr(self.info, "state", None)
        label = getattr(state, "value", str(state or "?")).lower()
        if label == "running" and not self.steps and self.progress is not None:
            return self.progress.phase
        return label

    def last_step_time(self) -> float | None:
        return self.last.get("time") if self.last else None

    def reset_streams(self) -> None:
        """Forget what was read from the run's files, before reading them again."""
        self.steps.clear()
        self.console_loss.clear()
        self.log.clear()
        self.start = self.oom = self.end = self.progress = None
        self.garbled = 0

    def add_event(self, event: dict) -> None:
        kind = event.get("event")
        if kind == "step":
            # Lists as tuples: the dict then holds only atomic values, and the garbage
            # collector stops tracking it; 5,000 steps of two lists each were a quarter of
            # what every full pass walked, tens of ms that land on key presses (docs/load.md).
            self.steps.append({k: tuple(v) if isinstance(v, list) else v for k, v in event.items()})
        elif kind == "start":
            self.start = event
            self.oom = self.end = None  # a relaunch into the same run dir
            # A resumed run redoes the steps after its last checkpoint: the ones logged
            # before it stopped would otherwise show twice, out of order.
            resumed = (event.get("config") or {}).get("resumed_from_step")
            if resumed is not None and self.steps and self.steps[-1].get("step", 0) > resumed:
                kept = [e for e in self.steps if e.get("step", 0) <= resumed]
                self.steps.clear()
                self.steps.extend(kept)
        elif kind == "oom":
            self.oom = event
        elif kind == "end":
            self.end = event


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


def format_number(value: float | None, digits: int = 4) -> str:
    if value is None:
        return "—"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if abs(value) >= 1e4:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}"
