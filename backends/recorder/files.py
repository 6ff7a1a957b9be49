"""The recording's files as the recorder keeps them on the host: each opened beside no link
and only where it is this user's alone, one kind's file of the day appended at a time,
the days older than KEEP_DAYS downsampled to one row a minute and the oldest dropped past
the cap (layout.py says what the files hold). Stdlib only: its source runs on the host,
after layout.py's (start.py).
"""

from __future__ import annotations

import calendar
import os
import sys
import threading
import time
from collections.abc import Iterable

if __package__:  # run inline (start.py), layout.py's names are there already
    from backends.recorder.layout import MAX_FILE_BYTES, MINUTE, day_of, file_name, lines, number, parse_name, parse_time


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

