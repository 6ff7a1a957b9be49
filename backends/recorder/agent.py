"""The recorder as it runs on a host: stdlib only, its source given inline to `python3 -c`
(backends/recorder/start.py), so nothing under the runs root is ever run. Also the one
home of the files' layout, which the reader (read.py) parses and this downsamples.

Under `<runs_root>/gpu/`, one file per UTC day per kind, appended, each line
`TIME,...` (TIME: seconds since the epoch), each text field escaped (`escape`):

    DAY.gpu    TIME,INDEX,UUID                       the GPU at INDEX is UUID from here on
               TIME,INDEX,POWER,LIMIT,USED,TOTAL,UTIL  a sample (W, W, MiB, MiB, %; empty: no reading)
    DAY.procs  TIME,GPU_UUID,PID,START_TICKS,USED_MIB,ANCESTORS (space-separated pids)
    DAY.panes  TIME,SOCKET,PANE_PID,SESSION          SOCKET "": tmux's default server
    DAY.logs   TIME,SIZE,PATH                        PATH relative to the runs root
    DAY.ticks  TIME                                  the recorder ran at TIME
               TIME,start,TICK_S                     it started at TIME, ticking every TICK_S

procs and panes are snapshots: the rows with one TIME are all there were then (a row of
TIME alone: none), written when they change and at the start of each file; a snapshot
holds until the next. logs holds the files whose size changed since the tick before (all
of them at the start of each file). GPU samples come from nvidia-smi's own loop (`-lms`),
the rest every TICK_S. Days older than KEEP_DAYS are downsampled to one row a minute (GPU
samples: the minute's means; snapshots and sizes: the minute's last) into `DAY.KIND.1m`,
and the oldest days go
while all files together hold more than the cap. Every file is opened beside no link and
written only where it is this user's alone.
"""

from __future__ import annotations

import calendar
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator

KINDS = ("gpu", "procs", "panes", "logs", "ticks")
SNAPSHOTS = ("procs", "panes", "logs")
COARSE = ".1m"
MINUTE = 60.0
KEEP_DAYS = 7
CAP_BYTES = 1 << 30
TICK_S = 5.0
LOOP_MS = 1000
MAX_LINE = 4096  # longer lines are no line of ours: skipped whole
MAX_LOGS = 20000  # log files indexed at most, per tick
MAX_FILE_BYTES = 256 << 20  # of one day file read (a day of 8 GPUs is ~33 MB: docs/benchmarks.md)
GPU_QUERY = ("index", "uuid", "power.draw", "power.limit", "memory.used", "memory.total", "utilization.gpu")
APPS_QUERY = ("gpu_uuid", "pid", "used_memory")
_DAY = re.compile(r"([0-9]{4}-[0-9]{2}-[0-9]{2})\.([a-z]+)(\.1m)?")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def day_of(t: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(t))


def file_name(day: str, kind: str, coarse: bool = False) -> str:
    return f"{day}.{kind}{COARSE if coarse else ''}"


def parse_name(name: str) -> tuple[str, str, bool] | None:
    """(day, kind, coarse) of a file of ours, else None."""
    m = _DAY.fullmatch(name)
    if m is None or m[2] not in KINDS:
        return None
    try:
        time.strptime(m[1], "%Y-%m-%d")
    except ValueError:  # 2026-02-31: no day
        return None
    return m[1], m[2], bool(m[3])


def escape(text: str) -> str:
    """`text` as one ASCII field: Python's escapes for backslashes, controls and anything
    not ASCII, and `\\x2c` for a comma."""
    return text.encode("unicode_escape").decode("ascii").replace(",", "\\x2c")


_ESCAPED = re.compile(r"(?:[^\\]|\\(?:[\\nrt]|x[0-9a-f]{2}|u[0-9a-f]{4}|U[0-9a-f]{8}))*")


def unescape(text: str) -> str | None:
    """What `escape` was given, or None for a field it cannot have written."""
    if not text.isascii() or not _ESCAPED.fullmatch(text):
        return None
    try:
        return text.encode("ascii").decode("unicode_escape")
    except UnicodeError:  # \U beyond U+10FFFF
        return None


# A line of ours: printable ASCII (`escape` leaves nothing else), MAX_LINE at most,
# starting with a time.
_LINE = re.compile(rb"^(?=[0-9]{10,11}(?:\.[0-9]{1,6})?[,\n])([ -~]{1,%d})\n" % MAX_LINE, re.MULTILINE)


def lines(data: bytes) -> Iterator[str]:
    """The complete lines of `data` (a last one without its newline is being written)
    that can be lines of ours, one by one; anything else (too long, not ASCII, not
    starting with a time) is skipped by the regex alone, so junk costs no Python per
    line and no memory."""
    return (m[1].decode() for m in _LINE.finditer(data))


def number(cell: str) -> str:
    """A reading as written: digits, or empty (nvidia-smi's `[N/A]`, anything else)."""
    cell = cell.strip()
    return cell if _NUMBER.fullmatch(cell) else ""


def parse_time(cell: str) -> float | None:
    try:
        t = float(cell)
    except ValueError:
        return None
    return t if 1e9 <= t <= 1e11 else None  # a time of this century, not nan or inf


def _minute(t: float) -> str:
    return f"{t - t % MINUTE:.0f}"


def downsample(kind: str, text_lines: Iterable[str]) -> list[str]:
    """One day's lines of `kind` as one row a minute (see the module's docstring)."""
    out: list[str] = []
    if kind == "gpu":
        buckets: dict[tuple[str, str, str], list[list[float]]] = {}
        uuids: dict[str, str] = {}
        for line in text_lines:
            cells = line.split(",")
            if parse_time(cells[0]) is None or not cells[1:2] or not cells[1].isdigit():
                continue
            if len(cells) == 3:
                uuids[cells[1]] = cells[2]
            elif len(cells) == 7:
                key = (_minute(parse_time(cells[0])), cells[1], uuids.get(cells[1], ""))
                sums = buckets.setdefault(key, [[] for _ in range(5)])
                for values, cell in zip(sums, cells[2:]):
                    if number(cell):
                        values.append(float(cell))
        declared: dict[str, str] = {}
        for (minute, index, uuid), sums in buckets.items():
            if uuid and declared.get(index) != uuid:
                out.append(f"{minute},{index},{uuid}")
                declared[index] = uuid
            means = ",".join(f"{sum(v) / len(v):.2f}" if v else "" for v in sums)
            out.append(f"{minute},{index},{means}")
    elif kind == "ticks":
        last = None
        for line in text_lines:
            cells = line.split(",")
            if (t := parse_time(cells[0])) is None:
                continue
            if cells[1:2] == ["start"]:
                out.append(line)
            elif (m := _minute(t)) != last:
                out.append(m)
                last = m
    elif kind == "logs":
        minutes: dict[str, dict[str, str]] = {}
        for line in text_lines:
            cells = line.split(",", 2)
            if len(cells) == 3 and (t := parse_time(cells[0])) is not None:
                minutes.setdefault(_minute(t), {})[cells[2]] = cells[1]
        out = [f"{minute},{size},{path}" for minute, sizes in minutes.items() for path, size in sizes.items()]
    else:
        kept: list[tuple[str, list[str]]] = []  # (minute, rows without time), the minute's last
        at, rows = None, []
        for line in [*text_lines, None]:
            cells = line.split(",", 1) if line is not None else ["", ""]
            if line is not None and parse_time(cells[0]) is None:
                continue
            if cells[0] != at:
                if at is not None:
                    minute = _minute(float(at))
                    if kept and kept[-1][0] == minute:
                        kept.pop()
                    kept.append((minute, rows))
                at, rows = cells[0], []
            if len(cells) > 1:
                rows.append(cells[1])
        before = None
        for minute, rows in kept:
            if rows != before:
                out += [f"{minute},{row}" for row in rows] or [minute]
            before = rows
    return out


# ---- the recorder itself: everything below runs on the host ----


def _read_fd(fd: int, most: int) -> bytes:
    chunks, left = [], most
    while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _ours(fd: int, directory: bool = False) -> bool:
    st = os.fstat(fd)
    kind = (st.st_mode & 0o170000) == (0o040000 if directory else 0o100000)
    return kind and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def _open(dirfd: int, name: str, flags: int) -> int | None:
    """`name` in the recording's directory, never through a link, only if ours alone
    (never waiting on a FIFO: it is opened without blocking, then refused)."""
    try:
        fd = os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o600, dir_fd=dirfd)
    except OSError:
        return None
    if not _ours(fd):
        os.close(fd)
        print(f"recorder: {name} is not this user's alone: not written", file=sys.stderr, flush=True)
        return None
    return fd


class Day:
    """One kind's file of the current day, appended."""

    def __init__(self, dirfd: int, kind: str):
        self.dirfd, self.kind = dirfd, kind
        self.day, self.fd = "", None
        self.lock = threading.Lock()

    def write(self, t: float, rows: list[str], header=None) -> bool:
        """Append `rows` (each without its time) at time `t`; a new file begins with
        `header()`'s rows. Whether the file was new."""
        with self.lock:
            day, new = day_of(t), False
            if day != self.day:
                if self.fd is not None:
                    os.close(self.fd)
                self.day, new = day, True
                self.fd = _open(self.dirfd, file_name(day, self.kind), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            if self.fd is None:
                return new
            stamp = f"{t:.2f}"
            rows = [*(header() if new and header else ()), *rows]
            text = "".join(f"{stamp},{row}\n" if row else f"{stamp}\n" for row in rows)
            try:
                os.write(self.fd, text.encode("ascii", "backslashreplace"))
            except OSError:
                pass  # a full disk loses this sample, never the recorder
            return new


def _stat(pid: int) -> tuple[int, int] | None:
    """(ppid, start ticks) of a process, from /proc."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()
        return int(fields[1]), int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def _uptime_ticks() -> int | None:
    """Now, in the clock ticks since boot that /proc/PID/stat's start time counts."""
    try:
        with open("/proc/uptime", "rb") as f:
            return int(float(f.read().split()[0]) * os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def _ancestors(pid: int) -> list[int]:
    chain, at = [], pid
    for _ in range(128):
        stat = _stat(at)
        if stat is None or stat[0] <= 0 or stat[0] in chain:
            break
        chain.append(stat[0])
        at = stat[0]
    return chain


def _run(argv: list[str], env: dict) -> str:
    try:
        return subprocess.run(argv, capture_output=True, timeout=15, env=env).stdout[: 1 << 20].decode(errors="replace")
    except (OSError, subprocess.SubprocessError):
        return ""


def procs_rows(smi: str, env: dict) -> list[str]:
    """The GPU processes nvidia-smi lists, each with what /proc says of its pid: its start
    and parents, unless that pid is a process started after the listing began (the listed
    one ended and its pid was reused), or gone: then its row says no more than the listing."""
    listed = _uptime_ticks()
    out = _run([smi, f"--query-compute-apps={','.join(APPS_QUERY)}", "--format=csv,noheader,nounits"], env)
    rows = []
    for line in out.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != 3 or not cells[1].isdigit() or "," in cells[0]:
            continue
        pid = int(cells[1])
        stat = _stat(pid)
        if stat is None or listed is None or stat[1] > listed:
            rows.append(f"{escape(cells[0])},{pid},,{number(cells[2])},")
            continue
        rows.append(f"{escape(cells[0])},{pid},{stat[1]},{number(cells[2])},{' '.join(map(str, _ancestors(pid)))}")
    return sorted(rows)


def panes_rows(sockets: list[str], env: dict) -> list[str]:
    rows = []
    for socket in sockets:
        out = _run(["tmux", "-L", socket or "default", "-u", "list-panes", "-a", "-F", "#{pane_pid} #{session_id}",
                    ";", "list-sessions", "-F", "#{session_id} #{session_name}"], env)  # fmt: skip
        found = out.split("\n")[:-1]
        count = next((i for i, line in enumerate(found) if not re.fullmatch(r"\d+ \$\d+", line)), len(found))
        panes = [line.split(" ") for line in found[:count]]
        names = dict(line.partition(" ")[::2] for line in found[count:])
        # A name printed over two lines (an older tmux keeps a newline) would break the
        # count of one line a session: then this socket's panes are not said this time.
        if len(names) != len(found) - count or set(names) != {sid for _, sid in panes}:
            continue
        rows += [f"{escape(socket)},{pid},{escape(names[sid])}" for pid, sid in panes]
    return sorted(rows)


def is_log_path(rel: str) -> bool:
    """Whether `rel` is a path `logs_rows` indexes: a run dir's console.log or a pane
    recording, relative to the runs root, with no `..`, `.` or empty part."""
    parts = rel.split("/")
    if any(part in ("", ".", "..") or "\0" in part for part in parts):
        return False
    if len(parts) == 2:
        return parts[0] not in ("gpu", "panes") and parts[1] == "console.log"
    return len(parts) == 4 and parts[0] == "panes" and parts[3].endswith(".log")


def logs_rows(root: str) -> list[str]:
    """The size of each pane recording and run dir console log, never through a link."""
    found: list[tuple[str, int]] = []

    def add(rel: str) -> None:
        try:
            st = os.lstat(os.path.join(root, rel))
        except OSError:
            return
        if (st.st_mode & 0o170000) == 0o100000 and len(found) < MAX_LOGS:
            found.append((rel, st.st_size))

    def dirs(rel: str) -> list[str]:
        try:
            with os.scandir(os.path.join(root, rel)) as it:
                return sorted(e.name for e in it if e.is_dir(follow_symlinks=False))[:MAX_LOGS]
        except OSError:
            return []

    for name in dirs(""):
        if name == "panes":
            for socket in dirs("panes"):
                for session in dirs(f"panes/{socket}"):
                    try:
                        with os.scandir(os.path.join(root, "panes", socket, session)) as it:
                            logs = sorted(e.name for e in it if e.name.endswith(".log"))[:64]
                    except OSError:
                        logs = []
                    for log in logs:
                        add(f"panes/{socket}/{session}/{log}")
        elif name != "gpu":
            add(f"{name}/console.log")
    return [f"{size},{escape(rel)}" for rel, size in found]


def rotate(dirfd: int, today: str, keep_days: int, cap: int) -> None:
    """Downsample the days older than `keep_days`; then drop the oldest days while all
    files hold more than `cap` bytes (today's never)."""
    oldest_full = day_of(calendar.timegm(time.strptime(today, "%Y-%m-%d")) - (keep_days - 1) * 86400)
    ours = {}
    for name in os.listdir(dirfd):
        parsed = parse_name(name)
        if parsed is None:
            continue
        try:
            st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
        except OSError:
            continue
        if (st.st_mode & 0o170000) == 0o100000 and st.st_uid == os.geteuid():
            ours[name] = (parsed, st.st_size)
    for name, ((day, kind, coarse), _) in sorted(ours.items()):
        if coarse or day >= oldest_full:
            continue
        fd = _open(dirfd, name, os.O_RDONLY)
        if fd is None:
            continue
        try:
            data = _read_fd(fd, MAX_FILE_BYTES)
        finally:
            os.close(fd)
        text = "".join(f"{row}\n" for row in downsample(kind, lines(data)))
        coarse_name, temp = file_name(day, kind, True), f".{name}.tmp"
        try:
            os.unlink(temp, dir_fd=dirfd)
        except OSError:
            pass
        out = _open(dirfd, temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        if out is None:
            continue
        try:
            os.write(out, text.encode())
            os.fsync(out)
        except OSError:
            os.close(out)
            os.unlink(temp, dir_fd=dirfd)
            continue
        os.close(out)
        try:  # a file it cannot remove (gone since, immutable) is left; the recorder goes on
            os.rename(temp, coarse_name, src_dir_fd=dirfd, dst_dir_fd=dirfd)
            os.unlink(name, dir_fd=dirfd)
        except OSError:
            continue
        ours.pop(name)
        ours[coarse_name] = ((day, kind, True), len(text))
    total = sum(size for _, size in ours.values())
    for day in sorted({parsed[0] for parsed, _ in ours.values()}):
        if total <= cap or day >= today:
            break
        for name, ((d, _, _), size) in list(ours.items()):
            if d == day:
                try:
                    os.unlink(name, dir_fd=dirfd)
                except OSError:
                    continue
                total -= size


def gpu_loop(days: Day, smi: str, loop_ms: int, env: dict, retry_s: float) -> None:
    argv = [smi, f"--query-gpu={','.join(GPU_QUERY)}", "--format=csv,noheader,nounits", "-lms", str(loop_ms)]
    declared: dict[str, str] = {}
    while True:
        try:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        except OSError:
            time.sleep(retry_s)
            continue
        assert proc.stdout is not None
        try:
            samples(proc.stdout, days, declared)
        except Exception as error:  # noqa: BLE001 - the loop goes on whatever one line did
            print(f"recorder: {error!r}", file=sys.stderr, flush=True)
        proc.kill()
        proc.wait()
        time.sleep(retry_s)


def samples(stdout, days: Day, declared: dict[str, str]) -> None:
    """nvidia-smi's rows as they come, each stamped with its arrival, into the day's file."""
    while line := stdout.readline(MAX_LINE):
        cells = [c.strip() for c in line.decode(errors="replace").split(",")]
        if len(cells) != len(GPU_QUERY) or not cells[0].isdigit():
            continue
        index, uuid = cells[0], escape(cells[1])
        changed, declared[index] = declared.get(index) != uuid, uuid
        rows = [f"{index},{uuid}"] if changed else []
        # A new day's file declares every GPU again, at its start.
        header = lambda: [f"{i},{u}" for i, u in declared.items() if not (changed and i == index)]  # noqa: E731
        days.write(time.time(), [*rows, ",".join([index, *map(number, cells[2:])])], header)


def main(argv: list[str]) -> None:
    root, socket, smi = argv[0], argv[1], argv[2]
    tick_s, loop_ms, keep_days, cap = float(argv[3]), int(argv[4]), int(argv[5]), int(argv[6])
    env = {k: v for k, v in os.environ.items() if k not in ("TMUX", "TMUX_PANE")}
    dirfd = os.open(os.path.join(root, "gpu"), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    if not _ours(dirfd, directory=True):
        sys.exit(f"recorder: {root}/gpu is not this user's alone")
    os.umask(0o077)
    days = {kind: Day(dirfd, kind) for kind in KINDS}
    now = time.time()
    rotate(dirfd, day_of(now), keep_days, cap)
    days["ticks"].write(now, [f"start,{tick_s:g}"])
    threading.Thread(target=gpu_loop, args=(days["gpu"], smi, loop_ms, env, tick_s), daemon=True).start()
    sockets = list(dict.fromkeys([socket, ""]))
    last: dict[str, list[str]] = {}
    while True:
        now = time.time()
        snapshot = {"procs": procs_rows(smi, env), "panes": panes_rows(sockets, env), "logs": logs_rows(root)}
        t = time.time()
        for kind, rows in snapshot.items():
            new_day = days[kind].day != day_of(t)
            if kind == "logs":  # the sizes that changed; all of them at a file's start
                changed = rows if new_day else sorted(set(rows) - set(last.get(kind, ())))
                if changed:
                    days[kind].write(t, changed)
            elif new_day or rows != last.get(kind):
                days[kind].write(t, rows or [""])  # a row of TIME alone: none
            last[kind] = rows
        if days["ticks"].write(t, [""]):
            rotate(dirfd, day_of(t), keep_days, cap)
        time.sleep(max(0.0, tick_s - (time.time() - now)))


if __name__ == "__main__":
    main(sys.argv[1:])
