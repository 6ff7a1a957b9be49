"""Every tmux pane's output, recorded on its host from the moment trackside first sees it.

A pane's screen holds only its last lines, and a progress bar redrawn in place keeps
only its newest state: a curve read from captures would hold only what happened to be on
screen when it was read. So the first listing that sees a pane starts `tmux pipe-pane`
into a file under the runs root, after writing what its scrollback held then (read once):

    <runs_root>/panes/<tmux socket>/<session>-<created>/<pane number>.scrollback
    <runs_root>/panes/<tmux socket>/<session>-<created>/<pane number>.log[.1]

The live file rotates at SEGMENT_BYTES, one older segment kept, so a pane that prints
for weeks holds at most two segments on disk; the recorder is a `sh` and a `head` per
pane, reading what the pane prints and nothing more (its cost: docs/benchmarks.md, "Pane
recording"), given inline so that nothing under the runs root is ever run, and kept going through a full disk.
The pipe ends with its pane; one that ended before it (killed) is started again by the next
listing, the log saying so. The runs root and every path of a recording in it are this
user's alone, or refused (backends/runsroot.py). A pane whose output already goes to a
pipe (a run trackside launched, which pipes into its run dir, or a pipe the user set) is
never piped again: `pipe-pane` would replace the user's pipe.
"""

from __future__ import annotations

import contextlib
import re
import shlex
from dataclasses import dataclass

from backends import runsroot, tmux
from backends.hosts import Host, HostError

SEGMENT_BYTES = 4 << 20
OLDER, LOST = ".1", ".lost"  # a read's key suffixes: the older segment; it, after a lost one
READ_BYTES = 1 << 20  # read at most this much of one pane a listing: a flood waits its turn
PANES_DIR = "panes"

# Appends stdin to file "$1", moving it to "$1.1" at each "$2" bytes ("$2" 0: never). head
# -c never reads past its count, so no byte is lost at a turn, and unbuffered (stdbuf) it
# writes each read as it comes. (dd cannot: with a byte count it still stops after
# count/bs reads, however short.) A host without stdbuf records the pane whole, unrotated.
# A write that fails (a full disk) loses what that read held, never the pipe: it pauses
# and reads on, and the output since waits in the pipe meanwhile. It ends at the pane's end
# (head or cat reading nothing), or when the file cannot be opened at all.
# Given inline to pipe-pane, so no file under the runs root is ever run.
_RECORDER = r"""f=$1 cap=$2
umask 077
stdbuf -o0 true 2>/dev/null || cap=0
while :; do
  exec 3>> "$f"
  if [ "$cap" = 0 ]; then
    until cat >&3; do sleep 1; done
    exit 0
  fi
  if stdbuf -o0 head -c "$cap" >&3; then
    [ "$(wc -c < "$f")" -ge "$cap" ] || exit 0
    mv -f "$f" "$f.1"
  else
    sleep 1
  fi
done
"""


def recorder(path: str, cap: int = 0) -> str:
    """The shell command that records a pane's output into `path` (rotated at `cap`
    bytes; 0: never), for pipe-pane (which the caller gives it through tmux's quoting)."""
    return shlex.join(["exec", "sh", "-c", _RECORDER, "sh", path, str(cap)])


# For each (target, dir under the runs root "$1", number, pipe command) after "$1" and "$2"
# (the socket, or empty): still unpiped, write the scrollback, then start the pipe, in one
# tmux command so no line falls between the two. A pane recorded before (its scrollback is
# there) whose pipe has ended gets its pipe again, and its log a line saying so.
_START = r"""root=$1 socket=$2; shift 2
[ -d "$root" ] || mkdir -p -- "$root" || exit 1
root_ok "$root"
while [ $# -ge 4 ]; do
  t=$1 d=$root/$2 n=$3 cmd=$4
  dirs_ok "$root" "$2"; shift 4
  [ "$(tmux ${socket:+-L "$socket"} display-message -p -t "$t" '#{pane_pipe}' 2>/dev/null)" = 0 ] || continue
  files_ok "$d/$n.scrollback" "$d/$n.log"
  if [ -e "$d/$n.scrollback" ]; then
    printf '\n[trackside] recording restarted at %s: what the pane printed since it stopped is missing\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >> "$d/$n.log"
    tmux ${socket:+-L "$socket"} pipe-pane -t "$t" "$cmd" 2>/dev/null
  else
    (set -C; tmux ${socket:+-L "$socket"} capture-pane -p -J -S - -t "$t" \; pipe-pane -t "$t" "$cmd" > "$d/$n.scrollback") 2>/dev/null
  fi
done
"""

# For each (key, file, offset, inode) after "$1" (bytes at most): a header `key size start
# count mtime inode`, then count bytes of the file from start. A live file that is no longer
# the inode last read has turned: the rest of the older segment comes first, whole, under
# the key with ".1" added; where it turned twice, the segment read last is gone, and the
# older one kept comes whole under the key with LOST added. A file is known by its inode
# and its birth time: ext4 hands the next file the inode just freed, so two turns could
# leave a live file with the inode last read. A file, or a directory above it, that
# another user could change ends the output with a `!` header, the reason after it.
_READ = r"""max=$1; shift
refuse() { printf '\n\036! %s\n' "$1"; exit 1; }  # said in the stream, which is all that is read
ID='%i.%.9W'  # a file: its inode and its birth (ext4 gives a file the inode the one before it freed)
emit() {  # key, file, offset, and at most how many bytes
  [ ! -L "$2" ] || refuse "$2 is a symbolic link (never followed)"
  [ ! -e "$2" ] || [ -f "$2" ] || refuse "$2 is not a regular file"
  # One open file for its size and its bytes: a turn (the rotator's mv) between reading
  # the two from the path would send fewer bytes than the header says.
  { set -- "$@" $(stat -L -c "%s %Y $ID %u %f" /dev/fd/3)
    [ "$8" = "$me" ] || refuse "$2 is owned by uid $8, not by this user (uid $me)"
    [ $((0x$9 & 022)) -eq 0 ] || refuse "$2 can be written by other users"
    o=$3; [ "$5" -lt "$o" ] && o=0
    n=$(( $5 - o )); [ "$n" -gt "$4" ] && n=$4
    printf '\n\036%s %s %s %s %s %s\n' "$1" "$5" "$o" "$n" "$6" "$7"
    [ "$n" -gt 0 ] && tail -c +$((o + 1)) <&3 | head -c "$n"
    true
  } 3<"$2" 2>/dev/null || printf '\n\036%s -1 0 0 0 -\n' "$1"
}
while [ $# -ge 4 ]; do
  k=$1 f=$2 o=$3 i=$4; shift 4
  case " $seen " in *" ${f%/*} "*) ;; *) above_ok "${f%/*}"; seen="$seen ${f%/*}" ;; esac
  if [ "$i" != - ] && [ "$(stat -c "$ID" "$f" 2>/dev/null)" != "$i" ]; then
    if [ "$(stat -c "$ID" "$f.1" 2>/dev/null)" = "$i" ]; then emit "$k.1" "$f.1" "$o" 1099511627776; else emit "$k.lost" "$f.1" 0 1099511627776; fi
    o=0
  fi
  emit "$k" "$f" "$o" "$max"
done
"""


@dataclass(frozen=True)
class Recording:
    """Where one pane's output is recorded on its host."""

    directory: str
    number: str  # the pane id without its '%'

    @property
    def log(self) -> str:
        return f"{self.directory}/{self.number}.log"

    @property
    def scrollback(self) -> str:
        return f"{self.directory}/{self.number}.scrollback"


# What a session's name may keep in a path: anything else (a foreign session may be named
# anything tmux allows, `#(…)` and `%d` included) becomes '_'.
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def recording_of(root: str, socket: str | None, pane: tmux.Pane) -> Recording:
    """The recording of `pane`, on a host whose (expanded) runs root is `root`."""
    name = _UNSAFE.sub("_", pane.session)
    session_dir = f"{root}/{PANES_DIR}/{_UNSAFE.sub('_', socket or 'default')}/{name}-{pane.created}"
    return Recording(session_dir, pane.pane_id.lstrip("%"))



async def start(host: Host, root: str, panes: list[tmux.Pane]) -> None:
    """Record every live, unpiped pane of `panes` from now on (a pane another listing just
    piped, or the user did, is left as it is; a dashboard's is never recorded).
    RunsRootRefused where the runs root, or a directory or file of a recording in it,
    is not this user's alone."""
    socket = host.tmux_socket
    args: list[str] = []
    for pane in panes:
        if pane.dead or pane.piped or not pane.pane_id or pane.dashboard:
            continue
        rec = recording_of(root, socket, pane)
        # tmux runs the pipe command with sh -c: quoted here, once.
        command = tmux.literal(recorder(rec.log, SEGMENT_BYTES), strftime=True)
        args += [pane.pane_id, rec.directory.removeprefix(f"{root}/"), rec.number, command]
    if args:
        result = await runsroot.run(host, _START, [root, socket or "", *args])
        if not result.ok:
            raise HostError(host.name, f"cannot record tmux panes: {result.stderr.strip()}")


@dataclass(frozen=True)
class Read:
    """Bytes of one recording from `start`; `size` is the file's, -1 when it is missing."""

    key: str
    size: int
    start: int
    data: bytes
    mtime: int  # the file's last change (epoch s), 0 when unknown
    inode: str = "-"  # which file it was ("-": none), so that a reader sees it turn


async def read(host: Host, files: list[tuple[str, str, int, str]], max_bytes: int = READ_BYTES) -> list[Read]:
    """The bytes of each (key, path, offset, inode last read or "-") since its offset, at
    most `max_bytes` each, in one host command; a recording that turned since gives the
    rest of its older segment first (key + OLDER), or, where it turned twice since and a
    segment's lines are gone, the older segment whole (key + LOST)."""
    if not files:
        return []
    argv = ["sh", "-c", runsroot.PRELUDE + _READ, "sh", str(max_bytes), *(str(part) for entry in files for part in entry)]
    out = bytearray()
    async with contextlib.aclosing(host.chunks(argv)) as chunks:
        async for chunk in chunks:
            out += chunk
    reads, at = [], 0
    while (head := out.find(b"\n\036", at)) >= 0:
        end = out.find(b"\n", head + 2)
        if end < 0:
            break
        if out.startswith(b"! ", head + 2):
            raise runsroot.RunsRootRefused(host.name, f"refused: {out[head + 4 : end].decode(errors='replace')}")
        try:
            key, size, start_at, count, mtime, inode = out[head + 2 : end].decode().rsplit(" ", 5)
            size, start_at, count, mtime = int(size), int(start_at), int(count), int(mtime)
        except ValueError:
            break
        data = bytes(out[end + 1 : end + 1 + count])
        after = end + 1 + count
        if len(data) < count or out[after : after + 2] not in (b"", b"\n\036"):
            # Fewer bytes than its header said: what follows is the next record, never
            # this one's. Nothing of it is taken; it is read again next time.
            reads.append(Read(key, size, start_at, b"", mtime, inode))
            at = end + 1
            continue
        reads.append(Read(key, size, start_at, data, mtime, inode))
        at = after
    return reads
