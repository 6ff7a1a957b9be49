"""A run at a moment: the metrics events written by then, its log then, and its host's
GPUs then, from what its host kept (`History`, read by backends/history/read.py).

The GPUs are the recording's (backends/recorder): a card's latest sample no older than
its interval allows, else no reading, and a moment inside one of the recorder's gaps says
so. Nothing is filled in between samples: a gap is a gap.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field

from backends.history.tape import LogAt, Tape
from backends.logs.console import ConsoleSummary
from training.contract import STEP

SAMPLE_S = 5.0  # a sample older than this at a moment is no reading then (the recorder's is ~1 s)
COARSE_S = 90.0  # the same, where the recording kept only 1-minute means


def fresh_s(recording, when: float) -> float:
    """How old a card's latest sample may be at `when` and still be its reading then."""
    return COARSE_S if recording.coarse_before is not None and when < recording.coarse_before else SAMPLE_S


@dataclass
class History:
    """What a run's host kept of it, read once. Times are seconds since the epoch."""

    name: str  # its run id, or the tmux session of a run trackside did not launch
    host: str
    run_id: str | None
    session: str
    start: float  # its first record
    end: float  # its last record (its end, or the latest the host had when read)
    ended: bool  # it had ended when read
    events: list[dict] = field(default_factory=list)  # metrics.jsonl's, in the file's order
    garbled: int = 0  # metrics lines that were no event
    params: dict = field(default_factory=dict)
    parent: str | None = None
    exit_status: int | None = None
    tape: Tape | None = None  # its log (a run dir's console.log, a pane's recording)
    recording: object | None = None  # backends.recorder.read.Recording over its life; None: none kept
    stops: list[dict] = field(default_factory=list)  # its kill journal's signals: {signal, time}
    relaunches: list[tuple[str, float]] = field(default_factory=list)  # (run id, started) of runs relaunched from it

    def __post_init__(self) -> None:
        self._event_times = [_time(e) for e in self.events]
        self.record(self.recording)

    def record(self, recording) -> None:
        """Its host's GPU recording, each card's samples indexed by time."""
        self.recording = recording
        self._gpus: dict[int, tuple[list[float], list]] = {}
        for sample in sorted(recording.gpus if recording is not None else (), key=lambda s: (s.index, s.time)):
            times, samples = self._gpus.setdefault(sample.index, ([], []))
            times.append(sample.time)
            samples.append(sample)

    @property
    def gpu_indices(self) -> list[int]:
        return sorted(self._gpus)

    def gpu_series(self, index: int) -> tuple[list[float], list]:
        """One card's samples, oldest first, and their times."""
        return self._gpus.get(index, ([], []))

    def events_to(self, when: float) -> list[dict]:
        """The events written by `when` (one with no time counts where it stands in the file)."""
        out, latest = [], None
        for event, at in zip(self.events, self._event_times):
            latest = at if at is not None else latest
            if (at if at is not None else latest or self.start) <= when:
                out.append(event)
        return out

    def step_times(self) -> list[float]:
        """When each step event was written, in order: where ←/→ by a step land."""
        return sorted({t for e, t in zip(self.events, self._event_times) if t is not None and e.get("event") == STEP})

    def gap_at(self, when: float):
        """The recorder's gap holding `when`, if one does: between its ends, which are the
        recorder's last tick before it and its first after (each recorded)."""
        if self.recording is None:
            return None
        return next((gap for gap in self.recording.gaps if gap.start < when < gap.end), None)


@dataclass(frozen=True)
class GpuAt:
    """One card at a moment: its sample (None: no reading then) and its power before it."""

    index: int
    sample: object | None  # a backends.recorder.read.GpuSample
    power_w: tuple[float, ...]  # its samples' power over the `history` samples up to the moment
    mem_mib: tuple[float, ...]


@dataclass(frozen=True)
class Frame:
    """The run at `time`."""

    time: float
    events: list[dict]
    log: LogAt
    console: ConsoleSummary | None  # what its log said by then, for a run with no step events
    gpus: tuple[GpuAt, ...]
    gpu_note: str  # why no card reads here ("" when they do)
    ended: bool  # it had ended by then


def frame_at(history: History, when: float, *, log_lines: int, history_samples: int) -> Frame:
    """The run at `when`: `log_lines` of its log, `history_samples` of each card's power."""
    events = history.events_to(when)
    ended = history.ended and when >= history.end
    tape = history.tape
    if tape is None:
        log = LogAt((), "no log kept")
    elif ended and not tape.recorded:
        log = tape.whole(log_lines)  # after its end the log is the file as it is
    elif not tape.recorded:
        log = LogAt((), "no recording of the log's size: its lines at this moment are unknown (the run's end shows them whole)")
    else:
        log = tape.log_at(when, log_lines)
    console = None
    if tape is not None and not any(e.get("event") == STEP for e in history.events):
        console = tape.console_at(when) if tape.recorded else (tape.console_to(len(tape.data)) if ended else None)
    gpus, gpu_note = _gpus_at(history, when, history_samples)
    return Frame(when, events, log, console, gpus, gpu_note, ended)


def _gpus_at(history: History, when: float, count: int) -> tuple[tuple[GpuAt, ...], str]:
    recording = history.recording
    if recording is None:
        return (), "no GPU recording on this host"
    gap = history.gap_at(when)
    cards = []
    for index in history.gpu_indices:
        times, samples = history.gpu_series(index)
        i = bisect.bisect_right(times, when)
        fresh = fresh_s(recording, when)
        recent = _since_break(times, samples, i, count, fresh)
        latest = recent[-1] if recent else None
        if latest is not None and (when - latest.time > fresh or gap is not None):
            latest = None
        cards.append(GpuAt(index, latest, tuple(s.power_w or 0.0 for s in recent), tuple(s.mem_used_mib or 0.0 for s in recent)))
    if gap is not None:
        return tuple(cards), f"the recorder was down here ({_clock(gap.start)}–{_clock(gap.end)}): no reading"
    if not cards:
        return (), "the recording holds no GPU sample"
    if all(card.sample is None for card in cards):
        return tuple(cards), "no GPU sample at this moment"
    return tuple(cards), ""


def _since_break(times: list[float], samples: list, end: int, count: int, fresh: float) -> list:
    """Up to `count` samples before index `end`, none from before a break in them (the
    recorder down): a sparkline joins what it is given, and a gap must not read as a slope."""
    start = end
    while start > max(0, end - count) and (start == end or times[start] - times[start - 1] <= fresh):
        start -= 1
    return samples[start:end]


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def _time(event: dict) -> float | None:
    t = event.get("time")
    if isinstance(t, bool) or not isinstance(t, (int, float)) or t != t or t in (float("inf"), float("-inf")):
        return None
    return float(t)
