"""The recording's files under `<runs_root>/gpu/`: their names, their lines, how a field is
escaped: the one home of the layout, which the recorder (agent.py, files.py) writes and
the reader (read.py) parses. Stdlib only: its source runs on the host too (start.py).

One file per UTC day per kind, appended, each line `TIME,...` (TIME: seconds since the
epoch), each text field escaped (`escape`):

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
and the oldest days go while all files together hold more than the cap (files.py).
"""

from __future__ import annotations

import calendar
import re
import time
from collections.abc import Iterator

GPU_DIR = "gpu"  # under the runs root
KINDS = ("gpu", "procs", "panes", "logs", "ticks")
SNAPSHOTS = ("procs", "panes", "logs")
COARSE = ".1m"
MINUTE = 60.0
KEEP_DAYS = 7
CAP_BYTES = 1 << 30
TICK_S = 5.0
LOOP_MS = 1000
MAX_LINE = 4096  # longer lines are no line of ours: skipped whole
MAX_FILE_BYTES = 256 << 20  # of one old day read to downsample (a day of 8 GPUs is ~33 MB: docs/benchmarks.md)
_DAY = re.compile(r"([0-9]{4}-[0-9]{2}-[0-9]{2})\.([a-z]+)(\.1m)?")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def day_of(t: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(t))


def day_start(day: str) -> float:
    """The first second of a UTC day `day_of` named."""
    return float(calendar.timegm(time.strptime(day, "%Y-%m-%d")))


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



def is_log_path(rel: str) -> bool:
    """Whether `rel` is a path the recorder indexes (agent.py's logs_rows): a run dir's
    console.log or a pane recording, relative to the runs root, with no `..`, `.` or
    empty part."""
    parts = rel.split("/")
    if any(part in ("", ".", "..") or "\0" in part for part in parts):
        return False
    if len(parts) == 2:
        return parts[0] not in (GPU_DIR, "panes") and parts[1] == "console.log"
    return len(parts) == 4 and parts[0] == "panes" and parts[3].endswith(".log")
