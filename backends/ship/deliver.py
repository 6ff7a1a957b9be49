"""What a launch takes to its host: the training package (backends.ship) and the host's
synced directories (backends.ship.sync) — found out, sent, then put in place.

The order is the contract with whoever stops a run to relaunch it (`R`): `send` does all
the travelling and every check that can fail (caps, interpreter, room, a host that cannot
write); only then may the old run be stopped; `Sent.put_in_place` then moves synced files
over the old ones (a shipped package needs nothing: it is a new directory), and the launch
records what it runs in its manifest (`code`, `synced`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

from backends import ship
from backends.hosts import Host
from backends.ship import sync

DEFAULT_PYTHON = "python3"  # what runs shipped code on a host that names no other


@dataclass(frozen=True)
class Delivery:
    """What to take: a package to ship (None: the trainer the host has), with the
    interpreter to run it, and directories to sync."""

    package: Path | None = None
    python: str = DEFAULT_PYTHON
    syncs: tuple[sync.SyncEntry, ...] = ()

    @classmethod
    def of_manifest(cls, manifest: dict) -> Delivery | None:
        """What a run took that can be taken again from here (its local directories are
        here: a dashboard on another machine has none of them); None if nothing."""
        code, synced = manifest.get("code"), manifest.get("synced") or []
        code = code if code and Path(code["source"]).is_dir() else None
        synced = [s for s in synced if Path(s["from"]).expanduser().is_dir()]
        if not code and not synced:
            return None
        return cls(
            Path(code["source"]) if code else None, code["python"] if code else DEFAULT_PYTHON,
            tuple(sync.SyncEntry.of_record(s) for s in synced),
        )  # fmt: skip

    def without_package(self) -> Delivery:
        """For a command that is not the trainer: its directories only."""
        return Delivery(None, self.python, self.syncs)

    async def changes(self, host: Host, manifest: dict) -> list[tuple[str, list[str]]]:
        """What differs between the code here and the code the run of `manifest` runs: a
        (what, its changed files) pair for each part that differs; empty when none does."""
        found = []
        code = manifest.get("code")
        if self.package is not None:
            tree = await asyncio.to_thread(ship.read_package, self.package)
            if not code or code.get("hash") != tree.hash:
                before = (await ship.files_there(host, code["dir"]) or {}) if code else {}
                found.append((f"{self.package} → {host.name}", ship.changes(before, tree.files)))
        recorded = {s.get("to"): s.get("hash") for s in manifest.get("synced") or []}
        for entry in self.syncs:
            compared = await sync.compare(host, entry)
            if recorded.get(compared.to) != compared.tree.hash or compared.differing:
                found.append((f"{entry.source} → {host.name}:{compared.to}", compared.changes))
        return found

    async def send_for(self, host: Host, *, trainer: bool) -> Sent:
        """Sent for a command: the trainer takes the package and the directories, another
        program its directories only."""
        return await (self if trainer else self.without_package()).send(host)

    async def send(self, host: Host) -> Sent:
        """Everything on the host and checked, nothing yet in a place a run uses."""
        shipped = await ship.ship(host, self.package, self.python) if self.package is not None else None
        staged = [await sync.stage(host, entry) for entry in self.syncs]
        return Sent(shipped, staged)


@dataclass(frozen=True)
class Sent:
    code: ship.Shipped | None = None
    synced: list[sync.Staged] = field(default_factory=list)

    async def put_in_place(self, host: Host) -> None:
        for staged in self.synced:
            await staged.put_in_place(host)

    def manifest(self) -> dict:
        """The launch's manifest fields: what its run runs."""
        return {"code": self.code.record() if self.code else None, "synced": [s.record() for s in self.synced]}

    def said(self) -> list[str]:
        return [part.said() for part in (self.code, *self.synced) if part is not None]

    def to_json(self) -> dict:
        sent = [{"what": part.said(), "sent_bytes": part.sent_bytes, "sent_files": list(part.sent_files)}
                for part in (self.code, *self.synced) if part is not None]  # fmt: skip
        return {**self.manifest(), "sent": sent}
