"""Syncing a user's directory to a fixed path on a host, for trainers trackside did not
write (`[[hosts.gpu1.sync]] from = "~/work/dflash"  to = "/root/dflash"`).

Unlike a shipped package, the directory's path on the host is the one its run's command
names, and it holds what only the host has (checkpoints, data: excluded, never sent nor
touched). So a sync is two steps: `stage` sends the files that differ from what the host
holds into a directory beside it, checked whole, while the old run still uses the old
files; `Staged.put_in_place` moves them over the old ones once that run has stopped.
Files only the host has are left as they are.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, replace
from pathlib import Path

from backends import ship
from backends.hosts import Host, HostError

DEFAULT_EXCLUDE = (".git", "__pycache__", "*.pyc", "checkpoints", "data")
DEFAULT_MAX_MIB = 64


@dataclass(frozen=True)
class SyncEntry:
    """A local directory and where it goes on the host, as the config gives it."""

    source: str  # local; `~` is this machine's home
    to: str  # on the host; `~` is its home there
    exclude: tuple[str, ...] = DEFAULT_EXCLUDE
    max_mib: float = DEFAULT_MAX_MIB

    def read(self) -> ship.Tree:
        return ship.scan(Path(self.source).expanduser(), exclude=self.exclude, max_mib=self.max_mib)

    def record(self) -> dict:
        return {"from": self.source, "to": self.to, "exclude": list(self.exclude), "max_mib": self.max_mib}

    @classmethod
    def of_record(cls, record: dict) -> SyncEntry:
        return cls(record["from"], record["to"], tuple(record["exclude"]), record["max_mib"])


# The files under "$1" but the excluded (the rest of the argv: find's prune expression),
# as `sha256sum` lists them, after the KiB free there; exit 4 when the host cannot write
# beside it (where files are staged).
_LIST = """t=$1; shift
mkdir -p "$t" && u=$(mktemp -d "$(dirname "$t")/.trackside-probe.XXXXXX") && rmdir "$u" || exit 4
df -Pk "$t" | awk 'NR == 2 { print $4 }'
cd "$t" && find . "$@" -type f -print0 | xargs -0 -r sha256sum
"""

# The staged files of "$1" moved over their places under "$2", then "$1" removed. A
# module's cached bytecode goes with its old source: Python checks a .pyc against its
# source's size and time to the second, which an edit can keep.
_PUT = f"""set -e
cd "$1"
rm -f {ship.FILES}
find . -type f | while IFS= read -r f; do
  mkdir -p "$(dirname "$2/$f")"
  mv -f "$f" "$2/$f"
  case $f in *.py) rm -f "$(dirname "$2/$f")/__pycache__/$(basename "$f" .py)".*.pyc ;; esac
done
cd /
rm -rf "$1"
"""


def _prune(exclude: tuple[str, ...]) -> list[str]:
    """find's expression that skips excluded names, directories whole."""
    if not exclude:
        return []
    names = [arg for pattern in exclude for arg in ("-o", "-name", pattern)][1:]
    return ["(", *names, ")", "-prune", "-o"]


async def _expanded(host: Host, path: str) -> str:
    if path == "~" or path.startswith("~/"):
        path = (await host.home()).rstrip("/") + path[1:]
    return path.rstrip("/") or "/"


@dataclass(frozen=True)
class Compared:
    """A local directory against its place on the host: the local tree, the host's path,
    the files there (path → SHA-256), its disk's free KiB, and what differs."""

    entry: SyncEntry
    tree: ship.Tree
    to: str
    there: dict[str, str]
    free_kib: int | None

    @property
    def differing(self) -> list[str]:
        """Local files the host lacks or holds otherwise (files only there stay)."""
        return sorted(p for p, digest in self.tree.files.items() if self.there.get(p) != digest)

    @property
    def changes(self) -> list[str]:
        return ship.changes({p: self.there[p] for p in self.tree.files if p in self.there}, self.tree.files)


async def compare(host: Host, entry: SyncEntry) -> Compared:
    """The local directory read (ShipError over its cap) and its place on the host listed."""
    tree = entry.read()
    to = await _expanded(host, entry.to)
    listed = await host.run(["sh", "-c", _LIST, "sh", to, *_prune(entry.exclude)], timeout=ship.SEND_S)
    if listed.returncode == 4:
        why = (listed.stderr.strip().splitlines() or ["permission denied"])[-1]
        raise ship.ShipError(f"{host.name}: cannot write {to} (inside its prefix): {why}")
    if not listed.ok:
        raise HostError(host.name, f"cannot list {to}: {listed.stderr.strip()}")
    free, _, listing = listed.stdout.partition("\n")
    there = {path.removeprefix("./"): digest for path, digest in ship.parse_listing(listing).items()}
    return Compared(entry, tree, to, there, int(free) if free.strip().isdigit() else None)


@dataclass(frozen=True)
class Staged:
    """A directory's differing files on the host beside their places, not yet in them."""

    entry: SyncEntry
    to: str
    hash: str
    describe: str | None
    staged_dir: str | None  # None: nothing differed
    sent_bytes: int = 0
    sent_files: tuple[str, ...] = ()

    async def put_in_place(self, host: Host) -> None:
        if self.staged_dir is None:
            return
        result = await host.run(["sh", "-c", _PUT, "sh", self.staged_dir, self.to], timeout=ship.SEND_S)
        if not result.ok:
            why = (result.stderr.strip().splitlines() or [f"exit status {result.returncode}"])[-1]
            raise ship.ShipError(ship.room_error(host, self.to, result.stderr) or f"{host.name}: cannot update {self.to}: {why}")

    def record(self) -> dict:
        """The manifest's `synced` entry: what the run's directory held, from where."""
        return {**self.entry.record(), "to": self.to, "hash": self.hash, "describe": self.describe}

    def said(self) -> str:
        what = f"{self.entry.source} → {self.to}"
        if not self.sent_files and self.staged_dir is None:
            return f"{what}: up to date, nothing sent"
        return f"{what}: {len(self.sent_files)} file(s) sent, {self.sent_bytes:,} bytes"


async def stage(host: Host, entry: SyncEntry) -> Staged:
    """Send what differs of `entry`'s directory to beside its place on the host; ShipError,
    one line, for a tree over its cap, a host that cannot write there or has no room."""
    compared = await compare(host, entry)
    staged = Staged(entry, compared.to, compared.tree.hash, ship.describe(compared.tree.root), None)
    differing = compared.differing
    if not differing:
        return staged
    need = sum(compared.tree.sizes[p] for p in differing)
    if compared.free_kib is not None and need + ship.ROOM_MARGIN > compared.free_kib * 1024:
        raise ship.ShipError(f"{host.name}: no room for {entry.source} in {compared.to}: {need / ship.MIB:.1f} MiB to send, "
                             f"{compared.free_kib / 1024:.1f} MiB free")  # fmt: skip
    # Content the host has at another path (a file moved or copied here) is copied there.
    have = {digest: f"{compared.to}/{path}" for path, digest in compared.there.items()}
    sent = await ship.stage(host, compared.tree, posixpath.dirname(compared.to) or "/", have=have, only=differing)
    return replace(staged, staged_dir=sent.dir, sent_bytes=sent.sent_bytes, sent_files=sent.sent_files)
