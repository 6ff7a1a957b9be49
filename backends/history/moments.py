"""The moments of a run's past that matter, in time order: each alert the dashboard would
have raised (backends/alerts.py's own rules, replayed event by event: a loss gone
non-finite or jumping, steps skipped, a stall, an OOM, a failed exit, a GPU under-fed),
the trainer's starts and end, its stops (the kill journal's signals), its relaunches and
the recorder's gaps.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from backends.alerts import LOSS_WINDOW, HostFacts, Rules, RunFacts, format_duration, host_alerts, run_alerts, stall_limit, underfed_since
from backends.gpu import GpuReading
from backends.history.frame import History
from backends.runs import RunInfo, RunPhase
from training.contract import END, FAILED, NONFINITE, OOM, START, STEP


@dataclass(frozen=True)
class Moment:
    time: float
    kind: str  # start, alert cause (oom, nan, jump, skipping, stall, failed, underfed), stop, relaunch, gap, end
    text: str


def moments_of(history: History, rules: Rules = Rules()) -> list[Moment]:
    found = [*_from_events(history, rules), *_from_recording(history, rules)]
    found += [Moment(s["time"], "stop", f"SIG{s['signal']} sent by a kill") for s in history.stops]
    found += [Moment(at, "relaunch", f"relaunched as {run_id}") for run_id, at in history.relaunches]
    if history.parent:
        found.append(Moment(history.start, "relaunch", f"relaunched from {history.parent}"))
    return sorted(found, key=lambda m: m.time)


def _info(history: History, phase: RunPhase, *, exit_status: int | None = None, end_status: str | None = None) -> RunInfo:
    return RunInfo(history.run_id, history.session, history.host, phase, exit_status=exit_status, end_status=end_status)


def _from_events(history: History, rules: Rules) -> list[Moment]:
    """Each event replayed through the alert rules as a watcher would have seen it then."""
    key = history.name
    running = _info(history, RunPhase.RUNNING)
    steps: deque[dict] = deque(maxlen=LOSS_WINDOW + 1)  # what the rules read
    up: set[str] = set()  # alerts up, by key: each is said when it comes
    found: list[Moment] = []
    nonfinite = oom = end = None

    def alerts(now: float, info: RunInfo = running, answered: bool = True) -> None:
        nonlocal up
        raised = run_alerts(RunFacts(key, info, list(steps), oom, nonfinite), now, rules, answered=answered)
        for alert in raised:
            if alert.key not in up:
                found.append(Moment(now, alert.cause, _own(alert.text, key)))
        up = {alert.key for alert in raised}

    for event in history.events:
        kind, at = event.get("event"), event.get("time")
        if not isinstance(at, (int, float)) or isinstance(at, bool):
            continue
        if kind == STEP:
            limit = stall_limit(steps, rules)
            if limit is not None and at - limit[0] > limit[1]:  # quiet past its limit before this step came
                alerts(limit[0] + limit[1] + 1)
            steps.append(event)
            alerts(at)
        elif kind == START:
            steps.clear()
            nonfinite = oom = end = None
            resumed = (event.get("config") or {}).get("resumed_from_step") if isinstance(event.get("config"), dict) else None
            found.append(Moment(at, "start", "trainer started" + (f", resuming after step {resumed}" if isinstance(resumed, int) and resumed > 0 else "")))
        elif kind == NONFINITE:
            nonfinite = event
            alerts(at)
        elif kind == OOM:
            oom = event
            alerts(at, _info(history, RunPhase.OOM), answered=False)
        elif kind == END:
            end = event
            status = event.get("status") if isinstance(event.get("status"), str) else "?"
            found.append(Moment(at, "end", f"trainer ended: {status}"))
    if history.ended:
        phase = RunPhase.OOM if oom is not None else RunPhase.EXITED
        end_status = end.get("status") if end and isinstance(end.get("status"), str) else None
        info = _info(history, phase, exit_status=history.exit_status, end_status=end_status)
        before = {m.kind for m in found}
        for alert in run_alerts(RunFacts(key, info, list(steps), oom, nonfinite), history.end, rules):
            if alert.cause not in before and alert.cause in (OOM, FAILED, NONFINITE):  # the alerts named by an end
                found.append(Moment(history.end, alert.cause, _own(alert.text, key)))
        code = history.exit_status
        found.append(Moment(history.end, "exit", "exited" + (f" with status {code}" if code is not None else "")))
    elif history.events:
        # Still running when read: a stall that holds now is said from when it began.
        limit = stall_limit(steps, rules)
        if limit is not None and history.end - limit[0] > limit[1]:
            found.append(Moment(limit[0] + limit[1], "stall", f"stalled: no step since {_clock(limit[0])}"))
    return found


def _from_recording(history: History, rules: Rules) -> list[Moment]:
    """The recorder's gaps, and its host's GPUs under-fed (the host's, as the dashboard
    says it: a card is the host's until a run is proven to hold it)."""
    recording = history.recording
    if recording is None:
        return []
    spans = [(max(g.start, history.start), g.end) for g in recording.gaps if g.end >= history.start and g.start <= history.end]
    found = [Moment(start, "gap", f"recorder down for {format_duration(end - start)}: no GPU reading until {_clock(end)}")
             for start, end in spans]  # fmt: skip
    up = False
    since: dict[int, float | None] = {}
    for sample in sorted(recording.gpus, key=lambda s: s.time):
        if not history.start <= sample.time <= history.end:
            continue
        reading = GpuReading(sample.index, uuid=sample.uuid, power_w=sample.power_w, power_limit_w=sample.power_limit_w,
                             mem_used_mib=sample.mem_used_mib, mem_total_mib=sample.mem_total_mib,
                             util_pct=sample.util_pct)  # fmt: skip
        since[sample.index] = underfed_since(reading, since.get(sample.index), sample.time)
        facts = HostFacts(history.host, None, [(reading, since[sample.index])])
        raised = host_alerts(facts, sample.time, rules)
        if raised and not up:
            found.append(Moment(sample.time, "underfed", raised[0].text))
        up = bool(raised) or (up and any(s is not None for s in since.values()))  # said once until every card is fed again
    return found


def _own(text: str, key: str) -> str:
    """An alert's words about the run replayed, without its name (the screen's title)."""
    return text.removeprefix(f"{key} ")


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))
