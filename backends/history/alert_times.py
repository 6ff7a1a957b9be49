"""When each of the watcher's alerts (backends/alerts.py's rules) would have been raised
and cleared over a past, replayed in time order: a run's from its metrics events, applied
at each event and where its steps went quiet past the stall limit, and at its end; a
host's under-fed GPUs from its recording, at each sample. The one replay behind `trackside
replay`'s moments (moments.py) and `trackside watch --since` (backends/history/missed.py).

Linear in the events and samples: the rules read a window of the latest steps, and a
host's cards are weighed again only where one of them changes state.
"""

from __future__ import annotations

import dataclasses
from collections import deque

from backends.alerts import LOSS_WINDOW, Alert, HostFacts, Rules, RunFacts, host_alerts, run_alerts, stall_limit, underfed_since
from backends.gpu import GpuReading
from backends.history.frame import fresh_s
from backends.recorder.layout import TICK_S
from backends.recorder.read import GAP_TICKS
from backends.runs import RunInfo, RunPhase
from training.contract import NONFINITE, OOM, START, STEP

Said = tuple[float, str, Alert]  # (when, "raised" or "cleared", the alert)


@dataclasses.dataclass
class RunPast:
    key: str  # "host/run": the alerts' subject
    info: RunInfo  # as it stood when read: its phase, exit status and end status
    events: list[dict]  # its metrics events that have a time, in time order
    ended: float | None  # when its command ended; None: still running when read
    answered_at: float | None = None  # when a relaunch of it started: from then its end is no news


def timed(events: list[dict]) -> list[dict]:
    """metrics.jsonl's events as read.parse_events keeps them (each time a number), in time order."""
    return sorted(events, key=lambda e: e["time"])


class _Up:
    """The alerts up, by key: each evaluation says which came and which went."""

    def __init__(self) -> None:
        self.alerts: dict[str, Alert] = {}
        self.said: list[Said] = []

    def now(self, at: float, alerts: list[Alert]) -> None:
        found = {alert.key: alert for alert in alerts}
        self.said += [(at, "cleared", alert) for key, alert in self.alerts.items() if key not in found]
        self.said += [(at, "raised", alert) for key, alert in found.items() if key not in self.alerts]
        self.alerts = found


def run_alert_times(run: RunPast, until: float, rules: Rules = Rules(), since: float | None = None) -> list[Said]:
    """The run's alerts as a watcher polling it would have raised and cleared them, each at
    the moment its cause came (a stall a second past its limit), up to `until`. With
    `since`, what a watcher started then would have said: the alerts up then, raised then
    in their words then (a stall's length), and what came after; nothing for a run over
    before it."""
    # An end known to the second (a file's mtime) may come before its last events.
    ended = None if run.ended is None else max(run.ended, run.events[-1]["time"] if run.events else run.ended)
    if since is not None and ended is not None and ended < since:
        return []
    running = dataclasses.replace(run.info, state=RunPhase.RUNNING, exit_status=None, end_status=None)
    steps: deque[dict] = deque(maxlen=LOSS_WINDOW + 1)  # what the rules read
    up = _Up()
    nonfinite = oom = None

    def evaluate(at: float, info: RunInfo | None = None, answered: bool = True) -> None:
        if info is None and oom is not None:  # its OOM stands until the process ends, whatever it does meanwhile
            info, answered = dataclasses.replace(running, state=RunPhase.OOM), False
        facts = RunFacts(run.key, info or running, list(steps), oom, nonfinite)
        up.now(at, run_alerts(facts, at, rules, answered=answered))

    def started_watching() -> None:
        evaluate(since)
        up.said = [(since, "raised", alert) for alert in up.alerts.values()]

    def stalled_by(at: float) -> None:
        if not steps or at - steps[-1]["time"] <= rules.stall_floor_s + 1:
            return  # sooner than any stall limit: the rules' medians need not be taken
        limit = stall_limit(steps, rules)
        if limit is not None and at - limit[0] > limit[1] + 1:
            evaluate(limit[0] + limit[1] + 1)

    watching = since is None
    for event in run.events:
        kind, at = event.get("event"), event["time"]
        if not watching and at > since:
            started_watching()
            watching = True
        if kind == STEP:
            stalled_by(at)  # quiet past its limit before this step came
            steps.append(event)
            evaluate(at)
        elif kind == START:  # a new process: what the last one left is not this one's
            steps.clear()
            nonfinite = oom = None
        elif kind == NONFINITE:
            nonfinite = event
            evaluate(at)
        elif kind == OOM:
            oom = event
            evaluate(at)
    if not watching:
        started_watching()
    if ended is None:
        stalled_by(until)
        return _from(up.said, since, until)
    stalled_by(ended)
    info = dataclasses.replace(run.info, state=RunPhase.OOM) if oom is not None else run.info
    relaunched = run.answered_at is not None and run.answered_at <= until
    evaluate(ended, info, answered=relaunched and run.answered_at <= ended)
    if relaunched and run.answered_at > ended:  # relaunched later: the watcher then let its end go
        evaluate(run.answered_at, info, answered=True)
    return _from(up.said, since, until)


def _from(said: list[Said], since: float | None, until: float) -> list[Said]:
    """What was said from `since` to `until`: a stall found after a later step may be dated before."""
    return said if since is None else [s for s in said if since <= s[0] <= until]


def host_alert_times(host: str, recording, start: float, end: float, rules: Rules = Rules()) -> list[Said]:
    """The host's under-fed alert over its recording's samples from `start` to `end`. Each
    card's latest sample is its reading until the recorder's gap window passes without
    another (a card gone from the listing); across a gap of the recorder no card has one,
    and what was up is cleared where the gap began."""
    cards: dict[int, tuple[GpuReading, float | None, float]] = {}  # index: reading, under-fed since, sampled at
    up = _Up()
    starved_from: float | None = None  # the earliest card's under-fed start, while one is
    gaps = iter(sorted((g for g in recording.gaps if g.end >= start and g.start <= end), key=lambda g: g.start))
    gap = next(gaps, None)
    last = None
    for sample in sorted((s for s in recording.gpus if start <= s.time <= end), key=lambda s: s.time):
        t = sample.time
        while gap is not None and gap.end <= t:  # the recorder was down before this sample
            if last is None or gap.end > last:
                if up.alerts:
                    up.now(max(gap.start, last or start), [])
                cards.clear()
                starved_from = None
            gap = next(gaps, None)
        reading = GpuReading(sample.index, None, sample.uuid, sample.power_w, sample.power_limit_w,
                             sample.mem_used_mib, sample.mem_total_mib, sample.util_pct)  # fmt: skip
        was = cards[sample.index][1] if sample.index in cards else None
        since = underfed_since(reading, was, t)
        cards[sample.index] = (reading, since, t)
        if was != since or (last is not None and int(t) != int(last)):
            # a card changed state, or a second passed: drop cards gone quiet and weigh them again
            quiet = max(GAP_TICKS * TICK_S, fresh_s(recording, t))
            for index in [i for i, (_, _, at) in cards.items() if t - at > quiet]:
                del cards[index]
            starved_from = min((s for _, s, _ in cards.values() if s is not None), default=None)
        last = t
        starving = starved_from is not None and t - starved_from >= rules.underfed_s
        if starving != bool(up.alerts):
            up.now(t, host_alerts(HostFacts(host, None, [(r, s) for r, s, _ in cards.values()]), t, rules))
    if up.alerts and gap is not None and gap.start <= end and (last is None or gap.end > last):
        up.now(max(gap.start, last or start), [])  # the recording ends in a gap: nothing stands after it
    return up.said
