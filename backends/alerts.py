"""Alerts: the causes an operator who looked away must not miss, each announced once.

The rules read plain data (a run's listing, its metrics step events, GPU readings), so
the dashboard and the headless `trackside watch` raise the same alerts from the same
facts. An alert's key names its cause (`stall:gpu1/20261129-0930-ab12`): the cause is
announced when it appears, listed while it lasts and cleared when it goes; if it comes
back it is announced again.

Causes: OOM, a run that exits non-zero or is killed, a trainer that stopped on non-finite
steps (none applied: training/nonfinite.py), a loss that turns NaN/inf or jumps
past LOSS_JUMP times its recent median, a GPU under-fed (under half its power limit while
it reads busy), a host lost, a run stalled (no step for STALL_TIMES its recent step time,
never less than a floor), and GPU memory still held after a kill. Runs that ended before
the watcher started are history, not alerts: only runs it saw running, or that started
after it began, count.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import shlex
import statistics
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from backends import sanitize
from backends.gpu import GpuReading
from backends.hosts.local import killed, started
from backends.runs import RunInfo, RunPhase
from backends.runs.status import RunStatus, signal_name, status_of
from training.contract import EVENT_FIELDS, OOM

UNDERFED_POWER = 0.5  # of the power limit
UNDERFED_UTIL = 90.0  # percent
LOSS_JUMP = 3.0  # times the median of the steps before it
LOSS_WINDOW = 20  # steps before the latest that the median and the step time are taken over
LOSS_MIN_STEPS = 5  # fewer steps before it are no baseline to jump from
STALL_TIMES = 10.0  # recent step times without a step
COMMAND_TIMEOUT_S = 10.0
HISTORY = 500  # alerts kept for the alerts screen


@dataclass(frozen=True)
class Rules:
    """The thresholds that are the operator's to choose (config `[alerts]`)."""

    underfed_s: float = 60.0  # under-fed this long before it is said
    stall_floor_s: float = 300.0  # a stall is never called sooner, however fast the steps


@dataclass(frozen=True)
class Alert:
    key: str  # "<cause>:<host or run key>"
    text: str
    severity: str = "warning"  # warning | error (Textual's notify words)

    @property
    def cause(self) -> str:
        return self.key.partition(":")[0]

    @property
    def subject(self) -> str:
        return self.key.partition(":")[2]

    def to_json(self, raised: float) -> dict:
        """What an alert command reads on its stdin."""
        return {
            "cause": self.cause, "subject": self.subject, "key": self.key, "severity": self.severity,
            "text": self.text, "time": raised, "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(raised)),
        }  # fmt: skip


@dataclass
class HostFacts:
    name: str
    lost: str | None = None  # why it cannot be reached; None while it answers
    gpus: Sequence[tuple[GpuReading, float | None]] = ()  # each reading, under-fed since when


@dataclass
class RunFacts:
    key: str
    info: RunInfo
    steps: Sequence[dict] = ()  # its latest metrics step events, oldest first
    oom: dict | None = None  # its oom event, if read
    nonfinite: dict | None = None  # its latest nonfinite event (a step skipped), if read


def format_duration(seconds: float | None) -> str:
    """To the nearest second (an epoch of 0.9 s reads 1s, not 0s); under half a second
    that is not nothing, <1s."""
    if seconds is None:
        return "—"
    if 0 < seconds < 0.5:
        return "<1s"
    seconds = round(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


def underfed_since(reading: GpuReading, since: float | None, now: float) -> float | None:
    """Since when the GPU has drawn under half its limit while reading busy, or None."""
    busy = reading.util_pct is not None and reading.util_pct > UNDERFED_UTIL
    starved = bool(reading.power_w is not None and reading.power_limit_w) and reading.power_w < UNDERFED_POWER * reading.power_limit_w
    if busy and starved:
        return now if since is None else since
    return None


def host_alerts(host: HostFacts, now: float, rules: Rules = Rules()) -> list[Alert]:
    alerts = []
    if host.lost is not None:
        alerts.append(Alert(f"lost:{host.name}", f"{host.name} lost: {host.lost}", "error"))
    starved = [(r, now - since) for r, since in host.gpus if since is not None and now - since >= rules.underfed_s]
    if starved:
        watts = [r.power_w for r, _ in starved]
        drawn = f"{min(watts):.0f}" if min(watts) == max(watts) else f"{min(watts):.0f}–{max(watts):.0f}"
        alerts.append(
            Alert(
                f"underfed:{host.name}",
                f"under-fed GPU{'s' if len(starved) > 1 else ''} {','.join(str(r.index) for r, _ in starved)} "
                f"on {host.name}: {drawn} W of {starved[0][0].power_limit_w:.0f} W at >{UNDERFED_UTIL:.0f}% util "
                f"for {format_duration(max(s for _, s in starved))} — give each step more work",
            )
        )
    return alerts


def _ended_alert(run: RunFacts) -> Alert | None:
    """A run that ended badly, as every screen words its end (backends/runs/status.py)."""
    status = status_of(run.info, oom=run.oom is not None)
    if status is RunStatus.OOM:
        oom = run.oom or {}
        params = ", ".join(f"{k}={oom[k]}" for k in EVENT_FIELDS[OOM] if k in oom)
        return Alert(f"oom:{run.key}", f"{run.key} ran out of GPU memory ({params or 'exit status 3'})", "error")
    if status is RunStatus.NONFINITE:
        return Alert(f"nonfinite:{run.key}", f"{run.key} stopped: step after step had a NaN/inf loss or gradient (none applied; its weights are its last finite step's)", "error")
    code = run.info.exit_status
    if status not in (RunStatus.FAILED, RunStatus.KILLED) or not code:
        return None
    how = f"was killed by {signal_name(-code)}" if code < 0 else f"failed: exit status {code}"
    return Alert(f"failed:{run.key}", f"{run.key} {how}", "error")


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _recent(steps: Sequence[dict]) -> list[dict]:
    """The latest step and the window before it, oldest first (a deque of thousands is not walked)."""
    return list(itertools.islice(reversed(steps), LOSS_WINDOW + 1))[::-1]


def _loss_alert(run: RunFacts) -> Alert | None:
    recent = _recent(run.steps)
    # A NaN or infinite loss in metrics.jsonl reads as absent (backends/untrusted_json.py):
    # a step that has its key, holding no number, is one.
    losses = [(e.get("step"), e["loss"]) for e in recent if "loss" in e and (e["loss"] is None or _number(e["loss"]))]
    if not losses:
        return None
    step, loss = losses[-1]
    if loss is None or not math.isfinite(loss):
        return Alert(f"nan:{run.key}", f"{run.key} loss is not finite at step {step}", "error")
    before = [value for _, value in losses[:-1] if value is not None and math.isfinite(value)]
    if len(before) >= LOSS_MIN_STEPS:
        median = statistics.median(before)
        if median > 0 and loss > LOSS_JUMP * median:
            return Alert(f"jump:{run.key}", f"{run.key} loss jumped to {loss:.4g} at step {step} ({loss / median:.1f}× its recent median {median:.4g})")
    return None


def _skipping_alert(run: RunFacts) -> Alert | None:
    """Steps skipped since the last applied one: the trainer goes on, the run does not learn."""
    skipped = run.nonfinite
    if skipped is None or run.info.state is not RunPhase.RUNNING:
        return None
    tried, applied = skipped.get("step"), (run.steps[-1].get("step") if run.steps else None)
    if not _number(tried) or (_number(applied) and applied >= tried):
        return None  # a step was applied after it: the run trains again
    in_a_row = skipped.get("in_a_row")
    count = f"{in_a_row} steps in a row" if _number(in_a_row) else "steps"
    what = skipped.get("what") if skipped.get("what") in ("loss", "grad_norm") else "loss or gradient"
    return Alert(f"skipping:{run.key}", f"{run.key} skipping {count} at step {tried}: its {what} is not finite (none applied)", "error")


def stall_limit(steps: Sequence[dict], rules: Rules = Rules()) -> tuple[float, float] | None:
    """(the latest step's time, the seconds without a step after it that are a stall), from
    the latest steps; None where no step has a time."""
    timed = [(e["time"], e.get("step", 0)) for e in _recent(steps) if isinstance(e.get("time"), (int, float))]
    if not timed:
        return None
    per_step = [(t1 - t0) / (s1 - s0) for (t0, s0), (t1, s1) in zip(timed, timed[1:]) if s1 > s0]
    return timed[-1][0], max(rules.stall_floor_s, STALL_TIMES * statistics.median(per_step)) if per_step else rules.stall_floor_s


def _stall_alert(run: RunFacts, now: float, rules: Rules) -> Alert | None:
    limit = stall_limit(run.steps, rules)
    if run.info.state is not RunPhase.RUNNING or limit is None:
        return None
    quiet = now - limit[0]
    if quiet <= limit[1]:
        return None
    return Alert(f"stall:{run.key}", f"{run.key} stalled: no step for {format_duration(quiet)}")


def run_alerts(run: RunFacts, now: float, rules: Rules = Rules(), *, answered: bool = False) -> list[Alert]:
    """A run's alerts; `answered`: its end is no news (the operator stopped or relaunched it)."""
    found = [_loss_alert(run), _skipping_alert(run), _stall_alert(run, now, rules)]
    if not answered:
        found.append(_ended_alert(run))
    return [alert for alert in found if alert is not None]


def kill_alert(key: str, report) -> Alert | None:
    """Memory still held after a kill, naming each straggler."""
    if report.released is not False and not report.stragglers:
        return None  # released, or nothing on the host could tell (no nvidia-smi)
    held = "; ".join(
        f"PID {p.pid} ({p.name}) holds {p.used_mib} MiB on GPU {p.gpu_index}" for p in report.stragglers
    ) or "GPU memory not released"
    return Alert(f"held:{key}", f"after killing {key}: {held}", "error")


@dataclass
class Entry:
    alert: Alert
    raised: float
    cleared: float | None = None


@dataclass
class AlertBook:
    """The alerts of one watcher (a dashboard, a `trackside watch`): which are up, when
    each was raised and cleared, and which runs are its to alert on."""

    since: float = field(default_factory=time.time)
    rules: Rules = field(default_factory=Rules)
    active: dict[str, Entry] = field(default_factory=dict)
    entries: deque[Entry] = field(default_factory=lambda: deque(maxlen=HISTORY))
    _seen_running: set[str] = field(default_factory=set)
    _stopped: set[str] = field(default_factory=set)

    @property
    def current(self) -> list[Alert]:
        return [entry.alert for entry in self.active.values()]

    def watches(self, run: RunFacts) -> bool:
        """Whether the run is this watcher's to alert on: running, seen running, or started since."""
        if run.info.state is RunPhase.RUNNING:
            self._seen_running.add(run.key)
            return True
        started = run.info.started or ""
        return run.key in self._seen_running or started >= time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.since))

    def evaluate(self, hosts: Iterable[HostFacts], runs: Iterable[RunFacts], now: float, extra: Iterable[Alert] = ()) -> list[Alert]:
        """Apply the rules to the fleet as it is now; the alerts raised by it, in order."""
        runs = list(runs)
        parents = {run.info.parent for run in runs if run.info.parent}
        found = [alert for host in hosts for alert in host_alerts(host, now, self.rules)]
        for run in runs:
            if self.watches(run):
                found += run_alerts(run, now, self.rules, answered=run.key in self._stopped or run.info.run_id in parents)
        return self.update([*found, *extra], now)

    def stopped(self, key: str) -> None:
        """The operator stopped this run from here: how it ends is not news to them."""
        self._stopped.add(key)

    def stop_failed(self, key: str) -> None:
        """The stop did not reach the run (its host went away): how it ends is news again."""
        self._stopped.discard(key)

    def update(self, alerts: Iterable[Alert], now: float) -> list[Alert]:
        """Record the alerts up now: new causes are raised (and returned), gone ones cleared."""
        active, raised = {}, []
        for alert in {alert.key: alert for alert in alerts}.values():
            entry = self.active.pop(alert.key, None)
            if entry is None:
                entry = Entry(alert, now)
                self.entries.append(entry)
                raised.append(alert)
            entry.alert = alert  # the same cause, its words updated (a duration)
            active[alert.key] = entry
        for gone in self.active.values():
            gone.cleared = now
        self.active = active  # in the rules' order: hosts, then runs
        return raised


async def run_command(argv: Sequence[str], alert: Alert, raised: float, timeout_s: float = COMMAND_TIMEOUT_S) -> str | None:
    """Run the configured alert command with the alert as JSON on its stdin, on this
    machine. None when it exits 0; else one line saying what went wrong. A command that
    outlives `timeout_s` is killed with everything it started."""
    shown = shlex.join(argv)
    try:
        process, pidfd = await started(
            argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
        )
    except OSError as error:
        return f"alert command {shown} could not start: {error.strerror or error}"
    done = False
    try:
        async with asyncio.timeout(timeout_s):
            # An alert names runs and sessions, which are anyone's: its JSON holds none of their controls.
            _, stderr = await process.communicate(json.dumps(sanitize.value(alert.to_json(raised))).encode() + b"\n")
        done = True
    except TimeoutError:
        return f"alert command {shown} did not finish within {timeout_s:g}s: killed"
    finally:  # timed out, or its watcher is quitting: nothing it started outlives it
        await killed(process, pidfd, early=not done)
    if process.returncode:
        said = [line for line in stderr.decode(errors="replace").splitlines() if line.strip()]
        return f"alert command {shown} exited {process.returncode}" + (f": {said[-1].strip()}" if said else "")
    return None
