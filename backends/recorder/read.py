"""THE reader of a host's recording (the files backends/recorder/agent.py writes under
`<runs_root>/gpu/`, laid out as layout.py says): what its GPUs drew and held, which
processes held them, which tmux panes existed and how long each log was, over a span of
time, and where nothing was recorded (Gap).

The files are the runs root's, so hostile: the parser is linear in its input and total
(a line it cannot read is skipped: too long, not ASCII, a number out of range, a field
missing), reads no link and no file of another user's, and a name is only ever compared
or printed through the sanitizer.
"""

from __future__ import annotations

import asyncio
import time
from bisect import bisect_right
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from backends import runsroot
from backends.hosts import Host
from backends.recorder import layout, reading
from backends.recorder.reading import MAX_READ_BYTES, Cursor

MAX_PID = 1 << 22  # the kernel's pid_max at most
MAX_ANCESTORS = 128
GAP_TICKS = 3.0  # ticks without a sample that make a gap
COARSE_GAP_S = 2.5 * layout.MINUTE  # in 1-minute data


@dataclass(frozen=True, slots=True)
class GpuSample:  # one GPU at one moment
    time: float  # seconds since the epoch
    index: int
    uuid: str
    power_w: float | None
    power_limit_w: float | None
    mem_used_mib: float | None
    mem_total_mib: float | None
    util_pct: float | None


@dataclass(frozen=True, slots=True)
class ProcSample:  # one compute process on one GPU at one moment
    time: float
    gpu_uuid: str
    pid: int
    start_ticks: int | None  # /proc/PID/stat field 22: tells a reused PID apart
    used_mib: float | None
    ancestors: tuple[int, ...]  # its parent chain (ppid, ppid's ppid, ... up to 1)


@dataclass(frozen=True, slots=True)
class PaneSample:  # which tmux pane roots existed, so a PID is tied to a session
    time: float
    socket: str  # the tmux socket's name (`tmux -L`), "" for the default server
    session: str  # raw: only ever compared, printed via the sanitizer
    pane_pid: int


@dataclass(frozen=True, slots=True)
class LogSize:  # a time index for logs: how long each log file was at a moment
    time: float
    path: str  # relative to the runs root (pane recordings, run dirs' logs)
    size: int


@dataclass(frozen=True, slots=True)
class Gap:  # the recorder was not running (or a sample is missing)
    start: float
    end: float


def _at(rows: tuple, times: tuple[float, ...], t: float) -> tuple:
    """The rows of the snapshot in effect at `t`: the latest at or before it."""
    i = bisect_right(times, t)
    if i == 0:
        return ()
    when = times[i - 1]
    return tuple(row for row in rows if row.time == when)


@dataclass(frozen=True, slots=True)
class Recording:
    gpus: tuple[GpuSample, ...]
    procs: tuple[ProcSample, ...]
    panes: tuple[PaneSample, ...]
    logs: tuple[LogSize, ...]
    gaps: tuple[Gap, ...]
    coarse_before: float | None  # samples before this are 1-minute means
    # The times of every procs and panes snapshot, those that found none included: a
    # snapshot holds until the next (procs_at, panes_at).
    proc_times: tuple[float, ...] = ()
    pane_times: tuple[float, ...] = ()
    # A reading cut short by its cap (read_recording's max_bytes) holds what was recorded
    # up to here: a reader that reads on goes on from here.
    read_to: float | None = None

    def procs_at(self, t: float) -> tuple[ProcSample, ...]:
        """The compute processes as last sampled at or before `t` (none before the first)."""
        return _at(self.procs, self.proc_times, t)

    def panes_at(self, t: float) -> tuple[PaneSample, ...]:
        return _at(self.panes, self.pane_times, t)

    def log_size_at(self, path: str, t: float) -> int | None:
        """How long the log at `path` was at `t`, as last indexed at or before it."""
        size = None
        for entry in self.logs:
            if entry.path == path and entry.time <= t:
                size = entry.size
        return size


_BAD = -1.0  # a reading no recorder wrote: its line is skipped


def _float(cell: str, top: float) -> float | None:
    """A reading, None where there was none, _BAD where it is no reading."""
    if not cell:
        return None
    if not layout.number(cell) or len(cell) > 24:
        return _BAD
    value = float(cell)
    return value if value <= top else _BAD


def _int(cell: str, low: int, top: int) -> int | None:
    if not cell.isdigit() or len(cell) > 12:
        return None
    value = int(cell)
    return value if low <= value <= top else None


def _text(cell: str, longest: int = 1024) -> str | None:
    text = layout.unescape(cell) if len(cell) <= 4 * longest and "," not in cell else None
    return text if text is not None and len(text) <= longest else None


@dataclass
class _Parsed:
    gpus: list[GpuSample] = field(default_factory=list)
    procs: list[ProcSample] = field(default_factory=list)
    panes: list[PaneSample] = field(default_factory=list)
    logs: list[LogSize] = field(default_factory=list)
    proc_times: list[float] = field(default_factory=list)
    pane_times: list[float] = field(default_factory=list)
    ticks: list[float] = field(default_factory=list)
    starts: list[tuple[float, float]] = field(default_factory=list)  # (time, tick_s)


def _gpu_file(lines: Iterable[str], out: _Parsed) -> None:
    uuids: dict[int, str] = {}  # each file declares its GPUs
    for line in lines:
        cells = line.split(",")
        t = layout.parse_time(cells[0])
        index = _int(cells[1], 0, 4095) if len(cells) > 1 else None
        if t is None or index is None:
            continue
        if len(cells) == 3 and (uuid := _text(cells[2], 128)) is not None:
            uuids[index] = uuid
        elif len(cells) == 7:
            values = [_float(c, top) for c, top in zip(cells[2:], (1e5, 1e5, 1e8, 1e8, 100.0))]
            if _BAD not in values:
                out.gpus.append(GpuSample(t, index, uuids.get(index, ""), *values))


def _proc(t: float, cells: list[str]) -> ProcSample | None:
    if len(cells) != 6:
        return None
    uuid, pid, ticks, used = _text(cells[1], 128), _int(cells[2], 1, MAX_PID), _int(cells[3], 0, 1 << 62), _float(cells[4], 1e8)
    chain = cells[5].split(" ") if cells[5] else []
    ancestors = tuple(a for a in (_int(c, 1, MAX_PID) for c in chain[:MAX_ANCESTORS]) if a is not None)
    if uuid is None or pid is None or len(ancestors) != len(chain) or (ticks is None and cells[3]) or used == _BAD:
        return None
    return ProcSample(t, uuid, pid, ticks, used, ancestors)


def _pane(t: float, cells: list[str]) -> PaneSample | None:
    if len(cells) != 4:
        return None
    socket, pid, session = _text(cells[1], 256), _int(cells[2], 1, MAX_PID), _text(cells[3])
    return PaneSample(t, socket, session, pid) if socket is not None and pid is not None and session is not None else None


def _snapshot_file(kind: str, lines: Iterable[str], out: _Parsed) -> None:
    times, rows, parse = (out.proc_times, out.procs, _proc) if kind == "procs" else (out.pane_times, out.panes, _pane)
    seen: set = set()  # the rows of the snapshot at times[-1]: one written twice is one
    for line in lines:
        cells = line.split(",", 5 if kind == "procs" else 3)
        t = layout.parse_time(cells[0])
        row = parse(t, cells) if t is not None and len(cells) > 1 else None
        if t is None or (row is None and len(cells) > 1) or (times and t < times[-1]):
            continue  # no row of ours, or one out of time's order
        if not times or times[-1] != t:
            times.append(t)
            seen = set()
        if row is not None and row not in seen:
            rows.append(row)
            seen.add(row)


def _logs_file(lines: Iterable[str], out: _Parsed) -> None:
    for line in lines:
        cells = line.split(",", 2)
        if len(cells) == 3 and (t := layout.parse_time(cells[0])) is not None:
            size, path = _int(cells[1], 0, 1 << 50), _text(cells[2], 4096)
            if size is not None and path is not None and layout.is_log_path(path):
                out.logs.append(LogSize(t, path, size))


def _ticks_file(lines: Iterable[str], out: _Parsed) -> None:
    for line in lines:
        cells = line.split(",")
        if (t := layout.parse_time(cells[0])) is None:
            continue
        if len(cells) == 1:
            out.ticks.append(t)
        elif len(cells) == 3 and cells[1] == "start" and (tick := _float(cells[2], 3600.0)) and tick > 0:
            out.starts.append((t, tick))
            out.ticks.append(t)


def _gaps(out: _Parsed, since: float, end: float | None, coarse_before: float | None) -> list[Gap]:
    """Where the recorder wrote nothing for longer than it would have: no GPU sample nor
    tick for GAP_TICKS of its ticks (COARSE_GAP_S in 1-minute data), and before each of
    its starts, back to what it wrote last."""
    times = sorted(t for t in {g.time for g in out.gpus} | set(out.ticks) if end is None or t <= end)  # none after now
    starts = sorted(out.starts)
    tick_s = [s for s, _ in starts]

    def limit(t: float) -> float:
        if coarse_before is not None and t < coarse_before:
            return COARSE_GAP_S
        i = bisect_right(tick_s, t)
        return GAP_TICKS * (starts[i - 1][1] if i else layout.TICK_S)

    started = set(tick_s)
    gaps = []
    if times and times[0] - since > limit(times[0]):
        gaps.append(Gap(since, times[0]))
    for a, b in zip(times, times[1:]):
        if b - a > limit(a) or (b in started and b > a):
            gaps.append(Gap(a, b))
    if end is not None:
        last = times[-1] if times else since
        if end - last > (limit(last) if times else 0.0):
            gaps.append(Gap(last, end))
    return [g for g in gaps if g.end >= since and (end is None or g.start <= end)]


def _in_order(gpus: Iterable[GpuSample]) -> tuple[GpuSample, ...]:
    """The samples in time order (a clock may step back), a GPU's at one time once (a
    day written twice)."""
    out: list[GpuSample] = []
    at: set[tuple[float, int]] = set()  # (time, index) of those at out[-1]'s time
    for g in sorted(gpus, key=lambda g: g.time):
        if out and out[-1].time != g.time:
            at = set()
        if (g.time, g.index) not in at:
            out.append(g)
            at.add((g.time, g.index))
    return tuple(out)


def parse_recording(files: Mapping[str, bytes], since: float, until: float | None, now: float | None = None) -> Recording:
    """The recording in `files` (each day file's name and bytes) from `since` to `until`
    (None: all there is). The procs and panes snapshot in effect at `since`, and each log's
    size then, come too (their times before `since`). `now`: when the recording would have
    gone on to (the trailing gap's end; `until` where sooner). Pure, linear in its input;
    a line it cannot read is skipped."""
    chosen: dict[tuple[str, str], tuple[bool, bytes]] = {}
    for name, data in files.items():
        parsed = layout.parse_name(name)
        if parsed is None:
            continue
        day, kind, coarse = parsed
        if (day, kind) not in chosen or chosen[(day, kind)][0]:  # a full day over its means
            chosen[(day, kind)] = (coarse, data)
    out = _Parsed()
    coarse_before = None
    for (day, kind), (coarse, data) in sorted(chosen.items()):
        lines = layout.lines(data)
        if coarse:
            coarse_before = max(coarse_before or 0.0, layout.day_start(day) + 86400)
        if kind == "gpu":
            _gpu_file(lines, out)
        elif kind in ("procs", "panes"):
            _snapshot_file(kind, lines, out)
        elif kind == "logs":
            _logs_file(lines, out)
        else:
            _ticks_file(lines, out)

    def within(t: float) -> bool:
        return t >= since and (until is None or t <= until)

    def from_snapshot(rows: list, times: list[float]) -> tuple[tuple, tuple[float, ...]]:
        times = sorted(set(times))
        first = bisect_right(times, since) - 1  # the snapshot in effect at `since`
        start = times[first] if first >= 0 else since
        kept = tuple(t for t in times if t >= start and (until is None or t <= until))
        return tuple(r for r in rows if r.time >= start and (until is None or r.time <= until)), kept

    procs, proc_times = from_snapshot(out.procs, out.proc_times)
    panes, pane_times = from_snapshot(out.panes, out.pane_times)
    before: dict[str, LogSize] = {}
    logs = []
    for entry in out.logs:
        if entry.time < since:
            before[entry.path] = entry
        elif within(entry.time):
            logs.append(entry)
    end = until if now is None else (now if until is None else min(until, now))
    return Recording(
        gpus=_in_order(g for g in out.gpus if within(g.time)),
        procs=procs,
        panes=panes,
        logs=(*before.values(), *logs),
        gaps=tuple(_gaps(out, since, end, coarse_before)),
        coarse_before=coarse_before,
        proc_times=proc_times,
        pane_times=pane_times,
    )


async def read_recording(
    host: Host, since: float, until: float | None = None, *, cursor: Cursor | None = None, max_bytes: int = MAX_READ_BYTES
) -> Recording:
    """The host's recording from `since` to `until` (None: now), reading only the day
    files that overlap and, of each, what lies after `since` (reading.py), at most
    `max_bytes` of them: a reading cut short says where (`Recording.read_to`). `cursor`: a
    caller that reads on passes the same one each time, and each reading fetches only what
    was appended since the last. Parsed off the event loop. RunsRootRefused where its
    directory is not this user's alone."""
    now = time.time()
    root = await host.expanded_runs_root()
    args = reading.plan(since, until or now, cursor)
    out = await reading.fetch(host, root, args, max_bytes)
    try:
        recording, fetched = await asyncio.to_thread(_parsed, out, args, since, until, now, cursor)
    except runsroot.RunsRootRefused as refused:
        raise runsroot.RunsRootRefused(host.name, refused.reason) from None
    if cursor is not None:
        cursor.moved_to(fetched)
    return recording


def _parsed(out: bytes, args: list[str], since: float, until: float | None, now: float, cursor: Cursor | None) -> tuple[Recording, reading.Fetched]:
    fetched = reading.assemble(out, args, since, cursor)
    if fetched.cut is None:
        return parse_recording(fetched.files, since, now if until is None else until, now=now), fetched  # none after now
    end = fetched.cut if until is None else min(until, fetched.cut)
    return replace(parse_recording(fetched.files, since, end, now=end), read_to=fetched.cut), fetched
