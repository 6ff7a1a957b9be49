"""The alerts that would have fired while nobody watched (`trackside watch --since`):
backends.watch's poll replayed every INTERVAL_S over the span, on facts as they stood
then, through the same AlertBook and rules (backends/alerts.py), so each alert reads as
it would have and carries the moment it would have been raised.

The facts at a moment come from what outlived it: the GPUs from the host's recording
(read.py; none where it has a gap, so no under-fed stretch spans one), a run of
trackside's from its run dir (its start in its manifest, its end when its exit status
was written, its steps and OOM in metrics.jsonl), a session it did not launch from its listing now and its pane's
recording (it ended when its log last grew, as the recorder's size index saw it).
"""

from __future__ import annotations

import calendar
import dataclasses
import time
from bisect import bisect_right

from backends import alerts, runs, runsroot, tmux
from backends.gpu import GpuReading
from backends.hosts import Host
from backends.logs import logparse, recording
from backends.recorder import agent
from backends.recorder.read import GAP_TICKS, Recording, read_recording
from backends.runs import RunInfo, RunPhase
from backends.runs.rundir import read_file
from backends.watch import INTERVAL_S
from training.contract import OOM, STEP

_ISO = "%Y-%m-%dT%H:%M:%SZ"  # a manifest's times


def _epoch(stamp: str | None) -> float | None:
    try:
        return float(calendar.timegm(time.strptime(stamp, _ISO))) if isinstance(stamp, str) else None
    except ValueError:
        return None


@dataclasses.dataclass
class History:
    """A run as it stood over the span: listed now, started and ended when."""

    facts: alerts.RunFacts
    started: float | None
    ended: float | None  # None: it still runs
    steps: list[dict]  # its metrics step events with a time, oldest first
    oom: dict | None = None

    def __post_init__(self) -> None:
        self.times = [s["time"] for s in self.steps]

    def at(self, t: float) -> alerts.RunFacts | None:
        """Its facts at `t`; None before it started."""
        if self.started is not None and t < self.started:
            return None
        steps = self.steps[: bisect_right(self.times, t)]
        info = self.facts.info
        if self.ended is None or t < self.ended:
            info = dataclasses.replace(info, state=RunPhase.RUNNING, exit_status=None, end_status=None)
            return alerts.RunFacts(self.facts.key, info, steps)
        oom = self.oom if self.oom is not None and self.oom.get("time", 0) <= t else None
        return alerts.RunFacts(self.facts.key, info, steps, oom)


# When the run's command ended: its exit_status file's last change (the launcher's shell
# writes it as the command ends; the manifest's `ended` is when a listing first saw it).
_EXITED_AT = 'above_ok "$1"; files_ok "$1/exit_status"; stat -c %Y -- "$1/exit_status" 2>/dev/null'


async def _trackside_run(host: Host, info: RunInfo, key: str) -> History:
    ended = None
    if info.state is not RunPhase.RUNNING:
        result = await runsroot.run(host, _EXITED_AT, [info.run_dir])
        ended = float(result.stdout) if result.ok and result.stdout.strip().isdigit() else None
    events = []
    try:
        text = await read_file(host, f"{info.run_dir}/metrics.jsonl")
        events = [e for e in map(logparse.parse_metrics_line, (text or "").splitlines()) if e is not None]
    except runs.RunError:
        pass
    timed = [e for e in events if isinstance(e.get("time"), (int, float)) and not isinstance(e.get("time"), bool)]
    steps = sorted((e for e in timed if e["event"] == STEP), key=lambda e: e["time"])
    oom = next((e for e in reversed(timed) if e["event"] == OOM), None)
    if info.state is not RunPhase.RUNNING and ended is None:
        ended = max((e["time"] for e in timed), default=None)  # its last word, where no status was written
    return History(alerts.RunFacts(key, info), _epoch(info.started), ended, steps, oom)


def _foreign_run(info: RunInfo, key: str, panes: list[tmux.Pane], root: str, socket: str | None, rec: Recording) -> History:
    """A session trackside did not launch: ended when its pane's log last grew."""
    logs = {recording.recording_of(root, socket, p).log.removeprefix(f"{root}/") for p in panes if p.session == info.session}
    grew = [e.time for e in rec.logs if e.path in logs]
    ended = None if info.state is RunPhase.RUNNING else max(grew, default=None)
    return History(alerts.RunFacts(key, info), None, ended, [])


class _Readings:
    """Each GPU's latest sample at or before a moment, none older than a gap would be."""

    def __init__(self, rec: Recording):
        self.gpus = rec.gpus
        self.times = [g.time for g in rec.gpus]

    def at(self, t: float) -> list[GpuReading]:
        latest: dict[int, GpuReading] = {}
        first = bisect_right(self.times, t - GAP_TICKS * agent.TICK_S)
        for g in self.gpus[first : bisect_right(self.times, t)]:
            latest[g.index] = GpuReading(g.index, None, g.uuid, g.power_w, g.power_limit_w, g.mem_used_mib, g.mem_total_mib, g.util_pct)
        return [latest[i] for i in sorted(latest)]


def replay(host: str, rec: Recording, histories: list[History], since: float, now: float,
           rules: alerts.Rules = alerts.Rules(), interval_s: float = INTERVAL_S) -> list[tuple[float, str, alerts.Alert]]:  # fmt: skip
    """The watcher's polls every `interval_s` from `since` to `now`, on the facts as they
    stood then: each alert raised or cleared as (when, "raised" or "cleared", alert)."""
    book = alerts.AlertBook(since=since, rules=rules)
    gpus = _Readings(rec)
    underfed: dict[int, float] = {}
    said: list[tuple[float, str, alerts.Alert]] = []
    t = since
    while t <= now:
        readings = [(r, alerts.underfed_since(r, underfed.get(r.index), t)) for r in gpus.at(t)]
        underfed = {r.index: s for r, s in readings if s is not None}
        facts = [f for h in histories if (f := h.at(t)) is not None]
        before = dict(book.active)
        raised = book.evaluate([alerts.HostFacts(host, gpus=readings)], facts, t)
        said += [(t, "cleared", entry.alert) for key, entry in before.items() if key not in book.active]
        said += [(t, "raised", alert) for alert in raised]
        t += interval_s
    return said


async def missed(host: Host, since: float, now: float, rules: alerts.Rules = alerts.Rules(), interval_s: float = INTERVAL_S) -> list[tuple[float, str, alerts.Alert]]:
    """Each alert that would have been raised or cleared on `host` from `since` to `now`
    (`replay`), from its recording, its run dirs and its listing now."""
    rec = await read_recording(host, since, now)
    root = await host.expanded_runs_root()
    infos = await runs.list_runs(host)
    panes = await tmux.list_panes(host)
    histories = []
    for info in infos:
        key = f"{host.name}/{info.run_id or info.session}"
        if info.run_id and info.run_dir:
            histories.append(await _trackside_run(host, info, key))
        elif info.run_id is None:
            histories.append(_foreign_run(info, key, panes, root, host.tmux_socket, rec))
    return replay(host.name, rec, histories, since, now, rules, interval_s)
