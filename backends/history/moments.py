"""The moments of a run's past that matter, in time order: each alert the dashboard would
have raised (backends/alerts.py's own rules, replayed event by event: a loss gone
non-finite or jumping, steps skipped, a stall, an OOM, a failed exit, a GPU under-fed),
the trainer's starts and end, its stops (the kill journal's signals), its relaunches and
the recorder's gaps.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from backends.alerts import Rules, format_duration
from backends.history.alert_times import RunPast, host_alert_times, run_alert_times, timed
from backends.history.frame import History
from backends.runs import RunInfo, RunPhase
from training.contract import END, START


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


def _from_events(history: History, rules: Rules) -> list[Moment]:
    """The trainer's starts and ends, and each alert the rules raise on its events
    (alert_times.py), as a watcher would have seen them then."""
    events = timed(history.events)
    found: list[Moment] = []
    end = None
    for event in events:
        if event.get("event") == START:
            end = None
            config = event.get("config") if isinstance(event.get("config"), dict) else {}
            resumed = config.get("resumed_from_step")
            found.append(Moment(event["time"], "start", "trainer started" + (f", resuming after step {resumed}" if isinstance(resumed, int) and resumed > 0 else "")))
        elif event.get("event") == END:
            end = event
            status = event.get("status") if isinstance(event.get("status"), str) else "?"
            found.append(Moment(event["time"], "end", f"trainer ended: {status}"))
    end_status = end.get("status") if end and isinstance(end.get("status"), str) else None
    info = RunInfo(history.run_id, history.session, history.host, RunPhase.EXITED if history.ended else RunPhase.RUNNING,
                   exit_status=history.exit_status, end_status=end_status)  # fmt: skip
    relaunched = min((at for _, at in history.relaunches), default=None)
    past = RunPast(history.name, info, events, history.end if history.ended else None, relaunched)
    found += [Moment(at, alert.cause, _own(alert.text, history.name))
              for at, word, alert in run_alert_times(past, history.end, rules) if word == "raised"]  # fmt: skip
    if history.ended:
        code = history.exit_status
        found.append(Moment(history.end, "exit", "exited" + (f" with status {code}" if code is not None else "")))
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
    found += [Moment(at, "underfed", alert.text)
              for at, word, alert in host_alert_times(history.host, recording, history.start, history.end, rules)
              if word == "raised"]  # fmt: skip
    return found


def _own(text: str, key: str) -> str:
    """An alert's words about the run replayed, without its name (the screen's title)."""
    return text.removeprefix(f"{key} ")


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))
