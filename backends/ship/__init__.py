"""Shipping local code to a host: the training package, content-addressed under the runs
root, so a fix made here is what the relaunch runs there.

A local tree is read into a `Tree` (each file's SHA-256; excludes and a size cap applied).
`stage` sends a tree through the host's ordinary command channel — a gzipped tar, base64 on
the command's stdin, unpacked by `sh` under the host's prefix — so it reaches a `pct exec`
container as every other command does. Only files the host does not already hold travel:
the others are copied there from where the host has them. The staged tree is checked
against its SHA-256 list before anything uses it, and `ship` renames it into
`<runs_root>/code/<hash>/` in one step: a half-sent tree is never run, and a hash already
there is not sent again.

A tree's symbolic links are refused, each named, and no file is read through one (each
is opened without following a link, every directory on its way too): a link to
/etc/shadow here would otherwise arrive there as a file holding this machine's. What is
shipped under the runs root is its user's alone there (0600 files, 0700 directories; the
root checked as backends/runsroot.py says).

The package is shipping whole: this module the trees and the training package, `sync` a
user's directories (trees too), `deliver` both sent before a kill and put in place after.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import io
import os
import stat
import subprocess
import tarfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import training.contract
from backends import runsroot
from backends.hosts import Host, HostError

MIB = 1 << 20
# The training package is well under 1 MiB; a tree this size means the wrong directory.
PACKAGE_MAX_MIB = 16
PACKAGE_EXCLUDE = ("__pycache__", "*.pyc")
# What the trainer needs on the host (pyproject's requires-python; tomllib, asyncio.timeout).
PYTHON_NEEDED = (3, 11)
FILES = ".trackside-files"  # a tree's `sha256sum` list, beside its files on the host
COPIES = ".trackside-copies"  # in a sent tar: files the host already has, to copy in
RECENT_TREES = 8  # shipped trees whose files a new one may copy instead of receiving
ROOM_MARGIN = 4 * MIB  # left free on the host's disk beyond what a tree takes
SEND_S = 600.0  # a sent tree over a slow link


class ShipError(Exception):
    """Code could not be shipped; one line, naming the host or the local tree."""


def local_package() -> Path:
    """The training package this trackside runs as `trackside train` here."""
    return Path(training.contract.__file__).resolve().parent


@dataclass(frozen=True)
class Tree:
    """A local directory's files as they would travel: path (under `name`, the directory's
    own name when shipped as a package) → SHA-256, and their sizes."""

    root: Path
    files: Mapping[str, str]
    sizes: Mapping[str, int]
    under: str = ""

    def local(self, path: str) -> Path:
        return self.root / path.removeprefix(f"{self.under}/") if self.under else self.root / path

    @property
    def listing(self) -> str:
        """The tree's `sha256sum` list: what is checked on the host, and what it hashes to."""
        return "".join(f"{digest}  {path}\n" for path, digest in sorted(self.files.items()))

    @property
    def hash(self) -> str:
        return hashlib.sha256(self.listing.encode()).hexdigest()

    @property
    def bytes(self) -> int:
        return sum(self.sizes.values())


def excluded(name: str, exclude: Iterable[str]) -> bool:
    """Whether a file or directory name matches an exclude (a glob on the name, as `find
    -name` reads it on the host)."""
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in exclude)


def read_unlinked(root: Path, path: str) -> tuple[bytes, os.stat_result]:
    """The bytes and status of file `path` under `root`, opened through no symbolic link:
    each directory on the way, and the file, opened as itself (OSError if one is a link,
    ShipError if the file is not a regular one)."""
    *parts, name = Path(path).parts
    at = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts:
            inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=at)
            os.close(at)
            at = inner
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=at)
    finally:
        os.close(at)
    with os.fdopen(fd, "rb") as f:
        status = os.fstat(f.fileno())
        if not stat.S_ISREG(status.st_mode):
            raise ShipError(f"{root / path}: not a regular file, not sent")
        return f.read(), status


def scan(root: Path, *, exclude: Iterable[str], max_mib: float, under: str = "") -> Tree:
    """`root`'s files, excluded names left out (directories whole), each path under `under`.

    ShipError when it is no directory, holds a symbolic link (each named: never followed,
    never sent), a name `sha256sum` would escape, or its files come to more than `max_mib`
    (the cap, stated)."""
    exclude = tuple(exclude)
    if not root.is_dir():
        raise ShipError(f"{root}: no such directory to send")
    files, sizes, links = {}, {}, []
    for top, dirs, names in os.walk(root):
        for name in [*dirs, *names]:
            if not excluded(name, exclude) and Path(top, name).is_symlink():
                links.append(f"{Path(top, name).relative_to(root).as_posix()} -> {os.readlink(Path(top, name))}")
        dirs[:] = sorted(d for d in dirs if not excluded(d, exclude) and not Path(top, d).is_symlink())
        for name in names:
            local = Path(top, name)
            if excluded(name, exclude) or local.is_symlink() or not stat.S_ISREG(local.lstat().st_mode):
                continue  # a link is refused below; a socket or a fifo: nothing to run
            relative = local.relative_to(root).as_posix()
            path = f"{under}/{relative}" if under else relative
            if any(c in path for c in "\n\t\\"):
                raise ShipError(f"{local}: a newline, tab or backslash in a file name cannot be sent")
            data, _ = read_unlinked(root, relative)
            files[path], sizes[path] = hashlib.sha256(data).hexdigest(), len(data)
    if links:
        raise ShipError(f"{root}: symbolic links are not sent (nor what they point at): {', '.join(sorted(links))}; "
                        "exclude them or put files in their place")  # fmt: skip
    tree = Tree(root, files, sizes, under)
    if tree.bytes > max_mib * MIB:
        raise ShipError(
            f"{root}: {tree.bytes / MIB:.1f} MiB to send after excludes ({', '.join(exclude) or 'none'}), "
            f"over the cap of {max_mib:g} MiB"
        )
    return tree


def describe(root: Path) -> str | None:
    """`git describe --always --dirty` of the checkout holding `root`; None when it is none."""
    try:
        result = subprocess.run(["git", "-C", str(root), "describe", "--always", "--dirty"],
                                capture_output=True, text=True, timeout=10, check=False)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() or None if result.returncode == 0 else None


def parse_listing(text: str) -> dict[str, str]:
    """A `sha256sum` list read back: path → SHA-256."""
    files = {}
    for line in text.splitlines():
        digest, sep, path = line.partition("  ")
        if sep and len(digest) == 64:
            files[path] = digest
    return files


def changes(before: Mapping[str, str], after: Mapping[str, str]) -> list[str]:
    """What changed from one tree to another, a line per file: `M path` (changed), `A path`
    (new), `D path` (gone)."""
    marks = {p: "M" for p in before if p in after and before[p] != after[p]}
    marks |= {p: "A" for p in after if p not in before} | {p: "D" for p in before if p not in after}
    return [f"{mark} {path}" for path, mark in sorted(marks.items())]


@dataclass(frozen=True)
class Staged:
    """A tree on the host, whole and checked: where it is, and what travelled for it."""

    dir: str
    sent_bytes: int  # of the command's input: the base64 of the gzipped tar
    sent_files: tuple[str, ...]  # sent as content; the others were copied on the host


# In a new directory under "$1": stdin (base64 of a gzipped tar) unpacked, the files it
# lists in COPIES copied from where the host has them, the whole checked against FILES.
# With "$2", renamed to it (another shipper's finished copy of the same tree is as good);
# else kept for the caller. With "$3", the runs root "$1" lies in: checked first
# (backends/runsroot.py), and the tree made its user's alone. Prints the directory; leaves
# nothing behind when it fails.
_STAGE = f"""set -e
[ -z "$3" ] || {{ root_ok "$3"; dirs_ok "$3" "${{1#"$3"/}}"; }}
d=$(mktemp -d "$1/.trackside-incoming.XXXXXX")
trap 'cd /; rm -rf "$d"' EXIT
cd "$d"
base64 -d | tar -xzf -
while IFS='\t' read -r from to; do
  mkdir -p "$(dirname "./$to")"
  cp -p "$from" "./$to"
done < {COPIES}
rm -f {COPIES}
[ -z "$3" ] || chmod -R go= .
sha256sum --quiet --strict -c {FILES} >&2 || {{ echo "the tree arrived incomplete" >&2; exit 5; }}
cd /
if [ -n "$2" ]; then
  mv -T "$d" "$2" 2>/dev/null || [ -d "$2" ] || {{ echo "cannot rename it into $2" >&2; exit 6; }}
  printf %s "$2"  # the trap removes "$d" where another shipper's copy was there first
else
  trap - EXIT
  printf %s "$d"
fi
"""


def _tar(tree: Tree, send: Iterable[str], copies: Mapping[str, str]) -> bytes:
    """A gzipped tar of the files to `send`, the tree's FILES list and the COPIES list."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:

        def add(path: str, data: bytes, mode: int = 0o600, mtime: float = 0) -> None:
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.mtime = len(data), mode, mtime
            tar.addfile(info, io.BytesIO(data))

        for path in send:
            data, status = read_unlinked(tree.root, tree.local(path).relative_to(tree.root).as_posix())
            # Its own time, not the epoch: Python trusts a cached .pyc whose source has the
            # size and time it was compiled from, and an edit that keeps the size would run stale.
            add(path, data, status.st_mode & 0o777, status.st_mtime)
        add(FILES, tree.listing.encode())
        add(COPIES, "".join(f"{source}\t{path}\n" for path, source in copies.items()).encode())
    return buffer.getvalue()


def room_error(host: Host, where: str, stderr: str) -> str | None:
    """One line for a host whose disk filled under a command, else None."""
    if "No space left on device" in stderr:
        return f"{host.name}: no room on the host for {where} (No space left on device)"
    return None


async def stage(host: Host, tree: Tree, into: str, *, have: Mapping[str, str], final: str = "", only: Iterable[str] | None = None,
                runs_root: str = "") -> Staged:
    """Put `tree` (or the files of it named in `only`) in a new directory under `into` on
    the host, renamed to `final` when given. `have` maps a SHA-256 to a path on the host
    holding that content: such files are copied there, not sent. `runs_root`, the root
    `into` lies in: checked first, and the tree made its user's alone."""
    paths = sorted(tree.files if only is None else only)
    copies = {p: have[tree.files[p]] for p in paths if tree.files[p] in have}
    send = [p for p in paths if p not in copies]
    part = tree if only is None else Tree(tree.root, {p: tree.files[p] for p in paths}, {p: tree.sizes[p] for p in paths}, tree.under)
    payload = base64.b64encode(_tar(part, send, copies)).decode()
    script = runsroot.PRELUDE + _STAGE if runs_root else _STAGE
    result = await host.run(["sh", "-c", script, "sh", into, final, runs_root], input=payload, timeout=SEND_S)
    if (refused := runsroot.refusal(host, result)) is not None:
        raise refused
    if not result.ok:
        why = result.stderr.strip().splitlines()[-1:] or [f"exit status {result.returncode}"]
        raise ShipError(room_error(host, into, result.stderr) or f"{host.name}: cannot unpack into {into}: {why[0]}")
    return Staged(result.stdout.strip(), len(payload), tuple(send))


# The interpreter "$1" names on the host (inside its prefix): its path, then its version
# and whether it has torch; exit 4 when there is none.
_PYTHON = """p=$(command -v "$1") || exit 4
printf '%s\\n' "$p"
exec "$p" -c 'import importlib.util, sys; print(*sys.version_info[:2], importlib.util.find_spec("torch") is not None)'
"""


async def check_python(host: Host, python: str) -> str:
    """The absolute path of `python` on the host, which must be PYTHON_NEEDED or newer and
    have torch; ShipError, one line, when it is missing or falls short."""
    result = await host.run(["sh", "-c", _PYTHON, "sh", python])
    setting = "(the host's `python` setting)"
    if result.returncode == 4:
        raise ShipError(f"{host.name}: no {python} on the host {setting}")
    lines = result.stdout.split()
    if not result.ok or len(lines) != 4 or not (lines[1] + lines[2]).isdigit():
        why = (result.stderr.strip().splitlines() or [f"exit status {result.returncode}"])[-1]
        raise ShipError(f"{host.name}: cannot run {python} {setting}: {why}")
    path, major, minor, torch = lines[0], int(lines[1]), int(lines[2]), lines[3] == "True"
    needed = ".".join(map(str, PYTHON_NEEDED))
    if (major, minor) < PYTHON_NEEDED:
        raise ShipError(f"{host.name}: {path} is Python {major}.{minor}; the trainer needs {needed} or newer {setting}")
    if not torch:
        raise ShipError(f"{host.name}: {path} has no torch, which the trainer needs {setting}")
    return path


# Under the code dir "$1" of runs root "$3": `have` when tree "$2" is there already. Else,
# once it is known that the host can write there, `need`, the KiB free, and the file lists
# of the newest trees (a record separator and its directory before each).
_PROBE = f"""c=$1
[ ! -e "$3" ] || root_ok "$3"
[ ! -e "$c" ] || dirs_ok "$3" code
if [ -d "$c/$2" ]; then echo have; exit 0; fi
mkdir -p "$c" && t=$(mktemp -d "$c/.trackside-probe.XXXXXX") && rmdir "$t" || exit 4
root_ok "$3"; dirs_ok "$3" code
echo need
df -Pk "$c" | awk 'NR == 2 {{ print $4 }}'
ls -dt "$c"/*/ 2>/dev/null | head -n {RECENT_TREES} | while read -r d; do
  [ -f "$d{FILES}" ] && printf '\\036%s\\n' "$d" && cat "$d{FILES}"
done
"""


@dataclass(frozen=True)
class Shipped:
    """A package shipped to a host, as a run's manifest records it (`code`): what it is
    (hash, and `git describe` where its source is a checkout), where it came from here and
    lies there, the interpreter that runs it; and what travelled this time."""

    hash: str
    describe: str | None
    source: str  # the local directory it was read from
    dir: str  # <runs_root>/code/<hash> on the host
    python: str  # its absolute path on the host
    package: str  # the directory's name: the module `python -m` runs
    sent_bytes: int = 0
    sent_files: tuple[str, ...] = ()

    def train_command(self) -> list[str]:
        """The trainer run from the shipped tree, ahead of the installed one (PYTHONPATH
        first), the user's own PYTHONPATH kept behind it."""
        run_from = 'd=$1; shift; PYTHONPATH="$d${PYTHONPATH:+:$PYTHONPATH}" exec "$@"'
        return ["sh", "-c", run_from, "sh", self.dir, self.python, "-m", self.package, "train"]

    def record(self) -> dict:
        return {"hash": self.hash, "describe": self.describe, "source": self.source, "dir": self.dir,
                "python": self.python, "package": self.package}  # fmt: skip

    @classmethod
    def of_record(cls, record: dict) -> Shipped:
        return cls(*(record[k] for k in ("hash", "describe", "source", "dir", "python", "package")))

    def said(self) -> str:
        what = f"{self.package} {self.hash[:12]}" + (f" ({self.describe})" if self.describe else "")
        if not self.sent_bytes:
            return f"{what}: already on the host, nothing sent"
        return f"{what}: {len(self.sent_files)} file(s) sent, {self.sent_bytes:,} bytes"


def read_package(source: Path) -> Tree:
    return scan(source, exclude=PACKAGE_EXCLUDE, max_mib=PACKAGE_MAX_MIB, under=source.name)


async def ship(host: Host, source: Path, python: str) -> Shipped:
    """The package at `source` on the host under `<runs_root>/code/<hash>/`, sent unless
    it is there already; ShipError, one line, when it cannot be (a tree over its cap, no
    interpreter fit to run it, a host that cannot write there or has no room)."""
    tree = read_package(source)
    python = await check_python(host, python)
    root = await host.expanded_runs_root()
    code = f"{root}/code"
    final = f"{code}/{tree.hash}"
    shipped = Shipped(tree.hash, describe(source), str(source), final, python, source.name)
    probe = await runsroot.run(host, _PROBE, [code, tree.hash, root])
    if probe.returncode == 4:
        why = (probe.stderr.strip().splitlines() or ["permission denied"])[-1]
        raise ShipError(f"{host.name}: cannot write {code} (inside its prefix): {why}")
    if not probe.ok:
        raise HostError(host.name, f"cannot read {code}: {probe.stderr.strip()}")
    head, *trees = probe.stdout.split("\036")
    if head.split()[:1] == ["have"]:
        return shipped
    free_kib = head.split()[1:2]
    have = {}
    for listed in trees:
        where, _, listing = listed.partition("\n")
        have |= {digest: f"{where}{path}" for path, digest in parse_listing(listing).items()}
    if free_kib and free_kib[0].isdigit() and tree.bytes + ROOM_MARGIN > int(free_kib[0]) * 1024:
        raise ShipError(f"{host.name}: no room for {source.name} in {code}: it takes {tree.bytes / MIB:.1f} MiB, "
                        f"{int(free_kib[0]) / 1024:.1f} MiB free")  # fmt: skip
    staged = await stage(host, tree, code, have=have, final=final, runs_root=root)
    return replace(shipped, sent_bytes=staged.sent_bytes, sent_files=staged.sent_files)


async def files_there(host: Host, shipped_dir: str) -> dict[str, str] | None:
    """The file list of a tree shipped there; None when it is gone."""
    result = await runsroot.run(host, 'above_ok "$1"; files_ok "$1/$2"; exec cat -- "$1/$2"', [shipped_dir, FILES])
    return parse_listing(result.stdout) if result.ok else None
