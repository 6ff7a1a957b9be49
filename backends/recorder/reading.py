"""Which bytes of a host's day files a reading of its recording fetches (read.py parses
them), so that a reading costs what it needs, not the days it spans:

- from `since` on: a day file that begins before `since` is read from a line at or before
  `since`'s, found on the host by bisecting on its lines' times (a probe reads 8 KiB), with
  the GPU declarations before it (grep's, on the host). Snapshots, sizes and ticks come
  whole: the snapshot in effect at `since` may be the file's first, and they are small;
- on from where the last reading ended (`Cursor`): a caller that reads on (the energy
  Ledger) fetches only what was appended since, and parses it after what the earlier
  lines left in effect (`kept`);
- at most MAX_READ_BYTES a call (each file at least FLOOR_BYTES, so a reading always goes
  on): a reading cut short ends where the first file cut ends (`Fetched.cut`), and a
  reader that reads on goes on from there next time.

The host command opens each file once and reads it only through that descriptor (a link,
or a file that is not this user's alone, is left out).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

from backends import runsroot
from backends.hosts import Host
from backends.recorder import layout

MAX_READ_BYTES = 2 << 20  # a call's bytes: ~1.5 h of 8 GPUs, ~45,000 samples (docs/benchmarks.md, "GPU recorder")
FLOOR_BYTES = 64 << 10
MAX_DAYS = 400  # a span longer than this is read from its last MAX_DAYS days
MARGIN_S = 60.0  # a Cursor keeps the lines this far before where it ended, whole
# Snapshots before the bulky samples: a cut then falls in a day's GPU samples.
ORDER = ("ticks", "procs", "panes", "logs", "gpu")

# "$1" the runs root, "$2" bytes at most in all, then three arguments a file of its gpu
# directory: its
# name, the byte offset to read on from (past its size: from 0), and `since` in whole
# seconds where the file is to be read from there (else -). For each file that exists:
# a header `\036NAME START SIZE CONTEXT COUNT`, CONTEXT bytes of the GPU declarations
# before START, COUNT bytes from START. A link, or a file that is not this user's alone,
# is left out; the runs root or its gpu directory not this user's alone (root_ok), or a
# directory above them another user could change, ends the output with a `\036!` header,
# the reason after it.
_READ = r"""export LC_ALL=C
refuse() { printf '\036! %s\n' "$1"; exit 1; }
root=$1 budget=$2; shift 2
dir=$root/@GPU@
[ -e "$dir" ] || [ -L "$dir" ] || exit 0
[ ! -L "$dir" ] || refuse "$dir is a symbolic link (never followed)"
root_ok "$root"; root_ok "$dir"
probe() {  # "OFFSET SECONDS" of the first whole line after byte $1 of fd 3 (SECONDS -: unreadable)
  tail -c +$(($1 + 1)) /dev/fd/3 2>/dev/null | head -c 8192 | {
    IFS= read -r part || exit 0
    IFS= read -r line
    t=${line%%[.,]*}
    case $t in ""|*[!0-9]*) t=- ;; esac
    [ ${#t} -le 11 ] || t=-
    echo "$(($1 + ${#part} + 1)) $t"
  }
}
seek() {  # a line start at or before the first line of second $2 or later, in fd 3 of $1 bytes
  lo=0 hi=$1
  while [ $((hi - lo)) -gt 16384 ]; do
    mid=$(((lo + hi) / 2))
    set -- "$2" $(probe $mid)
    # Earlier only where a line after mid says so; where none can, later lines are read too.
    if [ $# -eq 3 ] && [ "$3" != - ] && [ "$3" -lt "$1" ] && [ "$2" -lt "$hi" ]; then lo=$2; else hi=$mid; fi
    set -- 0 "$1"
  done
  echo $lo
}
one() {  # "$1" a file's name, "$2" its offset, "$3" its since or -
  n=$1 start=$2 since=$3 f=$dir/$1
  [ ! -L "$f" ] && [ -f "$f" ] || return 0
  command exec 3<"$f" || return 0  # gone since (a day downsampled)
  set -- $(stat -L -c '%s %u %f' /dev/fd/3)
  if [ $# -eq 3 ] && [ "$2" = "$me" ] && [ $((0x$3 & 022)) -eq 0 ]; then
    size=$1 ctx=
    [ "$start" -le "$size" ] || start=0
    if [ "$since" != - ] && [ "$start" -eq 0 ] && [ "$size" -gt 16384 ]; then
      start=$(seek "$size" "$since")
      [ "$start" -eq 0 ] || ctx=$(head -c "$start" /dev/fd/3 | grep -a -E '^[0-9.]{1,20},[0-9]{1,6},[^,]{1,1024}$' | tail -n 256)
    fi
    [ -z "$ctx" ] || ctx="$ctx
"
    c=$((size - start)) floor=$((size - start))
    [ "$floor" -le @FLOOR@ ] || floor=@FLOOR@
    [ "$c" -le "$budget" ] || c=$budget
    [ "$c" -ge "$floor" ] || c=$floor
    budget=$((budget - c))
    printf '\036%s %s %s %s %s\n%s' "$n" "$start" "$size" "${#ctx}" "$c" "$ctx"
    tail -c +$((start + 1)) /dev/fd/3 | head -c "$c"
  fi
  exec 3<&-
}
while [ $# -ge 3 ]; do one "$1" "$2" "$3"; shift 3; done
""".replace("@FLOOR@", str(FLOOR_BYTES)).replace("@GPU@", layout.GPU_DIR)


def days_between(since: float, until: float) -> list[str]:
    """The UTC days from `since`'s to `until`'s (the last MAX_DAYS of them)."""
    first = max(layout.day_start(layout.day_of(since)), layout.day_start(layout.day_of(until)) - (MAX_DAYS - 1) * 86400)
    days, at = [], first
    while at <= until:
        days.append(layout.day_of(at))
        at += 86400
    return days


@dataclass
class _Kept:
    offset: int  # read up to here (a line's end)
    lines: list[str]  # what a reading from Cursor.horizon on needs of the lines before offset (`kept`)
    in_long_line: bool = False  # offset is inside a line too long to be ours: skip to its end


@dataclass
class Cursor:
    """Where a caller's last reading ended, so that its next reads on: each file's offset
    and what its earlier lines leave in effect. Good for a reading from `horizon` on; one
    from earlier reads afresh (and the cursor starts again from it)."""

    horizon: float = math.inf
    files: dict[str, _Kept] = field(default_factory=dict)

    def moved_to(self, fetched: Fetched) -> None:
        if fetched.cursor is not None:
            self.horizon, self.files = fetched.cursor


def kept(kind: str, lines: list[str], horizon: float) -> list[str]:
    """Of a file's lines, in order, those a reading from `horizon` on needs: every line
    from `horizon` on, and of the earlier ones what is in effect then (each GPU's last
    declaration, the last procs or panes snapshot, each log's last size, the last start).
    Linear in the lines."""
    context: dict[str, str] = {}  # by what a later line of its kind would replace
    group_at, tail = "", []
    for line in lines:
        cell, _, rest = line.partition(",")
        t = layout.parse_time(cell)
        if t is None:
            continue
        if t >= horizon:
            tail.append(line)
        elif kind == "gpu":
            index, _, uuid = rest.partition(",")
            if uuid and "," not in uuid:
                context[index] = line
        elif kind in ("procs", "panes"):
            if cell != group_at:
                group_at, context = cell, {}
            context[str(len(context))] = line
        elif kind == "logs":
            context[rest.partition(",")[2]] = line
        elif rest.startswith("start,"):
            context[""] = line
    return [*context.values(), *tail]


@dataclass(frozen=True)
class Fetched:
    """What one reading fetched: each file's bytes to parse, where the reading was cut
    short by its cap (None: it read all there was), and the cursor's state after it (for
    `Cursor.moved_to`, once the reading is the caller's: a reading cancelled moves none)."""

    files: dict[str, bytes]
    cut: float | None
    cursor: tuple[float, dict[str, _Kept]] | None = None


def plan(since: float, until: float, cursor: Cursor | None) -> list[str]:
    """The host command's arguments after the directory and cap: each day file's name,
    offset and `since` (read.py's read_recording)."""
    usable = cursor is not None and since >= cursor.horizon
    args = []
    for day in days_between(since, until):
        bisect = f"{math.floor(since)}" if layout.day_start(day) < since else "-"
        for kind in ORDER:
            for coarse in (False, True):
                name = layout.file_name(day, kind, coarse)
                held = cursor.files.get(name) if usable and cursor is not None else None
                start = held.offset if held is not None else 0
                args += [name, str(start), bisect if kind == "gpu" and held is None and not coarse else "-"]
    return args


async def fetch(host: Host, root: str, args: list[str], max_bytes: int) -> bytes:
    """The host command's output: `_READ` run on the runs root `root` with `args` (`plan`)."""
    argv = ["sh", "-c", runsroot.PRELUDE + _READ, "sh", root, str(max_bytes), *args]
    out = bytearray()
    async with contextlib.aclosing(host.chunks(argv)) as chunks:
        async for chunk in chunks:
            out += chunk
    return bytes(out)


def _sections(out: bytes) -> list[tuple[str, int, int, bytes, bytes]]:
    """(name, start, size, context, data) of each file in `_READ`'s output;
    RunsRootRefused where it refused. A file cut short of its header's count, and all
    after it, is left out."""
    found, at = [], 0
    while out.startswith(b"\036", at):
        end = out.find(b"\n", at)
        if end < 0:
            break
        header = out[at + 1 : end].decode(errors="replace")
        if header.startswith("! "):
            raise runsroot.RunsRootRefused("", f"refused: {header[2:]}")
        cells = header.split(" ")
        if len(cells) != 5 or not all(c.isdigit() for c in cells[1:]):
            break
        start, size, ctx, count = (int(c) for c in cells[1:])
        body = end + 1
        if len(out) < body + ctx + count:
            break
        found.append((cells[0], start, size, out[body : body + ctx], out[body + ctx : body + ctx + count]))
        at = body + ctx + count
    return found


def _last_times(data: bytes) -> tuple[float | None, float | None]:
    """The time of the last complete line of `data` that has one, and the time before it:
    a file cut at a time may hold only some of that time's lines."""
    last = None
    for line in reversed(list(layout.lines(data))):
        if (t := layout.parse_time(line.partition(",")[0])) is not None:
            if last is None:
                last = t
            elif t < last:
                return last, t
    return last, None


def assemble(out: bytes, args: list[str], since: float, cursor: Cursor | None) -> Fetched:
    """The files to parse from the host command's output (`fetch`) for `plan`'s `args`:
    each after what the cursor kept of its earlier lines; and the cursor's state where this
    reading ended. Linear in the bytes fetched and kept."""
    asked = {args[i]: int(args[i + 1]) for i in range(0, len(args), 3)}
    usable = cursor is not None and since >= cursor.horizon
    sections = _sections(out)
    files, cut, latest = {}, math.inf, -math.inf
    for name, start, size, ctx, data in sections:
        held = cursor.files.get(name) if usable and cursor is not None else None
        if held is not None and start != held.offset:
            held = None  # read from 0: the file was replaced (a day downsampled)
        whole = start + len(data) == size
        if held is not None and held.in_long_line:
            data = data[data.find(b"\n") + 1 :] if b"\n" in data else b""
        before = "".join(f"{line}\n" for line in held.lines).encode() if held is not None else b""
        files[name] = before + ctx + data
        last, complete = _last_times(data)
        if not whole:  # cut by the cap: complete up to the time before its last line's,
            # or up to its last line's where what follows is too long to be a line of ours
            # (a time's lines are written in one append: the rest of them is not after it)
            done = last if len(data) - data.rfind(b"\n") - 1 > layout.MAX_LINE else complete
            cut = min(cut, done if done is not None else since)
        latest = max(latest, last if last is not None else -math.inf)
    moved: dict[str, _Kept] = {}
    horizon = min(cut, latest) - MARGIN_S
    if cursor is not None:
        for name, start, size, ctx, data in sections:
            parsed = layout.parse_name(name)
            if parsed is None or name not in asked:
                continue
            ended = data.rfind(b"\n") + 1
            long_line = ended == 0 and len(data) >= layout.MAX_LINE
            moved[name] = _Kept(start + (len(data) if long_line else ended), kept(parsed[1], layout.lines(files[name]), horizon), long_line)
    state = (horizon if moved else math.inf, moved) if cursor is not None else None
    return Fetched(files, None if cut == math.inf else cut, state)
