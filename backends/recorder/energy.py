"""A run's GPU time and energy, charged from a host's recording (backends/recorder/read.py).

A GPU process is a run's when, in the recorder's snapshot of the moment, its parent chain
reaches a pane process that tmux listed, in the snapshot of the same moment, as a pane of
the run's session on the run's tmux socket, and as one of the run's own panes (the one its
manifest names). Names decide nothing alone: a process may call itself anything, and a
session name is free again once its session ends, so anyone may take it (a relaunch takes
its parent's). A process proven a run's stays the run's while it lives as itself (its pid
with its start time: a reused pid is another process) and no pane of another session
becomes its ancestor (tmux can move a pane, process and all, to another session): a
worker orphaned to init still counts.

Between two readings of one GPU its power is integrated by the trapezoid and its time
counted, both charged to the processes on that GPU in the snapshot in effect: the whole to
one run's processes, or split by their used memory where others' share the card
(`Charge.shared` says so). A GPU with no process is charged to nobody. Wherever the
figure cannot be known — the recorder not running (its gaps, or readings further apart
than its loop allows), a power read `[N/A]`, a card shared with a process whose memory is
not said, no snapshot yet — nothing is guessed and the figure is a lower bound
(`Charge.at_least`).

Pure and Textual-free: one sort of the recording by time (linear on what the reader
gives, already in order), then one pass.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from backends.recorder import layout

if TYPE_CHECKING:
    from backends.recorder.read import PaneSample, ProcSample, Recording

# Readings of one GPU further apart than this are a gap: the recorder reads every second
# (its -lms 1000), so this allows a few lost lines; in its 1-minute means, at most two.
STEP_S = 5 * layout.LOOP_MS / 1000
COARSE_STEP_S = 3 * layout.MINUTE
JOULES_PER_KWH = 3.6e6
# A run whose start is not known (a session trackside did not launch) is charged this far
# back: the days the recorder keeps whole; its figure is a lower bound.
UNKNOWN_START_S = layout.KEEP_DAYS * 86400.0
# A reading continued: from the last charged moment's GPU readings (the snapshots in
# effect then come with them).
OVERLAP_S = STEP_S


@dataclass(frozen=True)
class RunIdentity:
    """Who a run is on its host, as the recording can tell: its tmux socket ('' for the
    default server) and session, the pids tmux gave its panes (the one its manifest names,
    or those a session trackside did not launch was seen with), and its span. A pane is
    the run's only with all three: a session's name passes to whoever takes it next (a
    relaunch takes its parent's)."""

    socket: str
    session: str
    pane_pids: frozenset[int]
    since: float = -math.inf
    until: float = math.inf

    def owns(self, pane: PaneSample) -> bool:
        return pane.pane_pid in self.pane_pids and pane.session == self.session and pane.socket == self.socket


@dataclass(frozen=True)
class Charge:
    """What a run is charged with: GPU-seconds (a card split with others by memory counts
    its share) and joules; `at_least`, some of its time could not be known; `shared`, a
    card it used held others' processes too, and was split by used memory."""

    gpu_s: float = 0.0
    joules: float = 0.0
    at_least: bool = False
    shared: bool = False

    @property
    def gpu_hours(self) -> float:
        return self.gpu_s / 3600

    @property
    def kwh(self) -> float:
        return self.joules / JOULES_PER_KWH

    def __add__(self, other: Charge) -> Charge:
        return Charge(self.gpu_s + other.gpu_s, self.joules + other.joules,
                      self.at_least or other.at_least, self.shared or other.shared)  # fmt: skip


Proven = dict[tuple[int, int], object]  # (pid, start ticks) → the run key it was proven to (None: another session's)


@dataclass(frozen=True)
class _Held:
    """One GPU at one process list: each holder's share of it, or None where it cannot be
    split; and whether any other holder was there."""

    shares: dict[object, float | None]
    shared: bool


def _number(value: float | None) -> float | None:
    return value if isinstance(value, (int, float)) and math.isfinite(value) and value >= 0 else None


def _by_time(items: Iterable, key=lambda x: x.time) -> list:
    return sorted(items, key=key)  # timsort: linear on a recording already in time order


def _snapshots(rows: Iterable, times: Iterable[float]) -> dict[float, list]:
    """Each snapshot's rows by its time (a time without rows: a snapshot of none)."""
    out: dict[float, list] = {t: [] for t in times}
    for row in rows:
        out.setdefault(row.time, []).append(row)
    return out


def _holders(procs: list[ProcSample], panes: list[PaneSample], runs: Mapping[object, RunIdentity], proven: Proven) -> dict[str, _Held]:
    """Each GPU's holders at one process list, by their parent chains and the panes of the
    same pass; `proven` carried forward and updated."""
    pane_of = {p.pane_pid: p for p in panes}
    by_gpu: dict[str, list[tuple[object, float | None]]] = {}
    for proc in procs:
        ident = (proc.pid, proc.start_ticks) if proc.start_ticks is not None else None
        pane = next((pane_of[pid] for pid in (proc.pid, *proc.ancestors) if pid in pane_of), None)
        if pane is not None:
            owner = next((key for key, run in runs.items() if run.owns(pane)), None)
            if ident is not None:
                proven[ident] = owner
        else:  # no pane above it now: what it was proven to, if it is still itself
            owner = proven.get(ident) if ident is not None else None
        by_gpu.setdefault(proc.gpu_uuid, []).append((owner, _number(proc.used_mib)))
    held = {}
    for uuid, rows in by_gpu.items():
        owners = {owner for owner, _ in rows}
        if len(owners) == 1:
            held[uuid] = _Held({owners.pop(): 1.0}, False)
            continue
        total = sum(used for _, used in rows if used is not None)
        known = total > 0 and all(used is not None for _, used in rows)
        shares: dict[object, float | None] = {}
        for owner, used in rows:
            shares[owner] = (shares.get(owner) or 0.0) + used / total if known else None
        held[uuid] = _Held(shares, True)
    return held


def charge(
    recording: Recording, runs: Mapping[object, RunIdentity], start: float = -math.inf, end: float = math.inf,
    proven: Proven | None = None,
) -> dict[object, Charge]:
    """Each run's charge (keyed as `runs`) for GPU time between `start` and `end`, within
    its own span. `proven`: processes proven to runs before this recording (updated in
    place), for a reading continued from an earlier one."""
    proven = {} if proven is None else proven
    charges = {key: Charge() for key in runs}
    spans = {key: (max(start, run.since), min(end, run.until)) for key, run in runs.items()}
    # Who held each GPU from each moment either snapshot changed, until the next.
    proc_shots = _snapshots(recording.procs, recording.proc_times)
    pane_shots = _snapshots(recording.panes, recording.pane_times)
    lists: list[tuple[float, dict[str, _Held]]] = []
    procs: list = []
    panes: list = []
    for time in sorted(proc_shots.keys() | pane_shots.keys()):
        procs, panes = proc_shots.get(time, procs), pane_shots.get(time, panes)
        lists.append((time, _holders(procs, panes, runs, proven)))
    list_times = [t for t, _ in lists]
    gaps = _merged(recording.gaps)
    gap_starts = [g0 for g0, _ in gaps]

    def unknown(a: float, b: float) -> None:
        """Time nobody can be charged for: every run it overlaps is a lower bound."""
        for key, (lo, hi) in spans.items():
            if a < hi and b > lo:
                charges[key] = replace(charges[key], at_least=True)

    readings = _by_time(recording.gpus, key=lambda s: (s.uuid, s.time))
    coarse = recording.coarse_before if recording.coarse_before is not None else -math.inf
    for s0, s1 in zip(readings, readings[1:]):
        if s0.uuid != s1.uuid or s1.time <= s0.time or s1.time <= start or s0.time >= end:
            continue
        a, b = s0.time, s1.time
        if b - a > (COARSE_STEP_S if b <= coarse else STEP_S) or _in_gap(gaps, gap_starts, a, b):
            unknown(a, b)
            continue
        # The recorder lists processes a moment after its first GPU reading: that first
        # list stands for its first moments too (within one step); before, nobody knows.
        at = max(bisect.bisect_right(list_times, a) - 1, 0 if list_times and list_times[0] <= b + STEP_S else -1)
        if at < 0:
            unknown(a, b)
            continue
        held = lists[at][1].get(s0.uuid)
        if held is None:
            continue  # no process on it: nobody's
        p0, p1 = _number(s0.power_w), _number(s1.power_w)
        watts = (p0 + p1) / 2 if p0 is not None and p1 is not None else None
        for key, share in held.shares.items():
            if key not in charges:
                continue
            lo, hi = spans[key]
            seconds = min(b, hi) - max(a, lo)
            if seconds <= 0:
                continue
            if share is None:
                charges[key] = replace(charges[key], at_least=True, shared=True)
                continue
            joules = watts * share * seconds if watts is not None else 0.0
            charges[key] = charges[key] + Charge(share * seconds, joules, watts is None, held.shared)
    begun = min((s.time for s in readings), default=math.inf)
    for key, (lo, hi) in spans.items():
        if lo < min(begun, hi) - STEP_S:  # the run began before the recording did
            charges[key] = replace(charges[key], at_least=True)
    return charges


def _merged(gaps: Iterable) -> list[tuple[float, float]]:
    """Gaps as disjoint spans in time order."""
    out: list[tuple[float, float]] = []
    for g0, g1 in sorted((g.start, g.end) for g in gaps):
        if out and g0 <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], g1))
        else:
            out.append((g0, g1))
    return out


def _in_gap(gaps: list[tuple[float, float]], starts: list[float], a: float, b: float) -> bool:
    """Whether (a, b) overlaps a gap: the last one starting before b, the gaps disjoint."""
    i = bisect.bisect_left(starts, b) - 1
    return i >= 0 and gaps[i][1] > a


@dataclass
class Ledger:
    """A host's charges kept up as its recording is read on: each reading charges its runs
    the time since the last (`done`), from the GPU readings just before it (OVERLAP_S);
    a run new to it, from its own start. A reading cut short by the reader's cap charges
    the runs it reaches to where it ends, and the next reads on from there (`marks`)."""

    done: float = -math.inf
    charges: dict = field(default_factory=dict)
    proven: Proven = field(default_factory=dict)
    marks: dict = field(default_factory=dict)  # the runs charged only up to a time before `done`
    behind: bool = False  # the last reading was cut short: more to read

    def said(self) -> dict:
        """The charges as they may be said now: lower bounds while readings catch up."""
        if not self.behind and not self.marks:
            return dict(self.charges)
        return {key: replace(c, at_least=True) for key, c in self.charges.items()}

    def _mark(self, key: object) -> float | None:
        """Where a run is charged through (None: a run new to it)."""
        return self.marks.get(key, self.done) if key in self.charges else None

    def read_from(self, runs: Mapping[object, RunIdentity]) -> float:
        """Where the next reading of the recording should start (0: its beginning)."""
        starts = [run.since if (mark := self._mark(key)) is None else mark for key, run in runs.items()]
        if self.done > -math.inf:
            starts.append(self.done)
        return max(0.0, min(starts, default=self.done) - OVERLAP_S)

    def add(self, recording: Recording, runs: Mapping[object, RunIdentity]) -> None:
        """Charge what `recording` (read from `read_from(runs)`) holds after each run's
        mark (`done`), and a new run's whole span."""
        self.behind = recording.read_to is not None
        lasts: dict[str, float] = {}
        for s in recording.gpus:
            lasts[s.uuid] = max(lasts.get(s.uuid, -math.inf), s.time)
        newest = max(lasts.values(), default=-math.inf)
        # Charged through the latest reading that every card still read has: a card's
        # time up to its next reading is charged when that reading comes.
        through = min((t for t in lasts.values() if t >= newest - STEP_S), default=-math.inf)
        by_mark: dict[float | None, dict] = {}
        for key, run in runs.items():
            mark = self._mark(key)
            if through > -math.inf and (mark is None or through > mark):
                by_mark.setdefault(mark, {})[key] = run
        # The new runs' first, then from the oldest marks: the older snapshots, so
        # `proven` ends as the newest say.
        for mark, group in sorted(by_mark.items(), key=lambda item: -math.inf if item[0] is None else item[0]):
            for key, c in charge(recording, group, -math.inf if mark is None else mark, through, self.proven).items():
                self.charges[key] = c if mark is None else self.charges[key] + c
                self.marks[key] = through
        self.done = max(self.done, through)
        self.marks = {key: mark for key, mark in self.marks.items() if mark < self.done}
        # A gap past the last reading charged: the recorder is not recording now (it
        # died), so what the runs do meanwhile is not known.
        if any(g.end > self.done for g in recording.gaps):
            for key, run in runs.items():
                if key in self.charges and run.until > self.done:
                    self.charges[key] = replace(self.charges[key], at_least=True)
