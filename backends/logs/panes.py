"""What panes said (backends.logs.console's fold), read from their recorded output: each pane
of a tmux session trackside did not launch, and which pane holds its run; and the
console.log of a run of trackside's that writes no metrics.jsonl (any program launched).

`Recordings` keeps each pane's fold and how far its recording was read, so a dashboard's
listings read only what is new; a one-off reading (`trackside runs`, `plot`) starts a
fresh one and reads everything. A pane whose output goes to a pipe the user set has no
recording of ours: its scrollback is read each time instead, the most it can show.
"""

from __future__ import annotations

import codecs
from collections.abc import Collection
from dataclasses import dataclass, field

from backends import procs, tmux
from backends.hosts import Host
from backends.logs import recording
from backends.logs.console import ConsoleSummary


@dataclass
class _Tape:
    """One pane's recording as read so far."""

    summary: ConsoleSummary
    offset: int = 0
    # A character cut by the end of a read waits for the rest (at most 3 bytes); the line
    # being drawn waits in the summary's terminal (bounded there, backends.logs.screen).
    utf8: codecs.IncrementalDecoder = field(default_factory=lambda: codecs.getincrementaldecoder("utf-8")("replace"))
    inode: str = "-"  # the live file last read: another one there means it turned
    started: bool = False  # its scrollback (what the pane held before) was read
    recorded: bool = True  # False: a pipe the user set, so no recording of ours


@dataclass(frozen=True)
class PaneRead:
    """What one pane said, and since when that is complete."""

    pane: tmux.Pane
    summary: ConsoleSummary
    since: float | None  # when its recording started (epoch s); None: not recorded, screen only


@dataclass
class Recordings:
    """A host's pane recordings, read on from where the last reading stopped."""

    _tapes: dict[str, _Tape] = field(default_factory=dict)
    _since: dict[str, float] = field(default_factory=dict)
    _logs: dict[str, _Tape] = field(default_factory=dict)  # runs' console.logs, by path

    async def read(self, host: Host, panes: list[tmux.Pane], *, drain: bool = False) -> dict[str, PaneRead]:
        """Each pane's fold (by pane id), recording the panes not yet recorded. `drain`
        reads every recording to its end; else at most recording.READ_BYTES of each."""
        panes = [p for p in panes if p.pane_id and not p.dashboard]  # a dashboard draws others' numbers
        if not panes:
            return {}
        root = await host.expanded_runs_root()
        await recording.start(host, root, panes)
        socket = host.tmux_socket
        recs = {p.pane_id: recording.recording_of(root, socket, p) for p in panes}
        tapes = {pid: self._tapes.get(rec.log) or _Tape(ConsoleSummary()) for pid, rec in recs.items()}
        self._tapes = {recs[pid].log: tape for pid, tape in tapes.items()}  # panes gone are forgotten
        self._since = {log: t for log, t in self._since.items() if log in self._tapes}
        fresh = [pid for pid, tape in tapes.items() if not tape.started]
        # A pane first read here: what its scrollback held when its recording started, then
        # the older segment of the recording where it has turned, then (below) the live one.
        first = [(pid, recs[pid].scrollback, 0, "-") for pid in fresh] + [(pid + recording.OLDER, f"{recs[pid].log}.1", 0, "-") for pid in fresh]
        for got in await recording.read(host, first, max_bytes=1 << 26):
            pid, older = got.key.removesuffix(recording.OLDER), got.key.endswith(recording.OLDER)
            tape = tapes[pid]
            if older:
                self._fold(tape, got.data)
                continue
            tape.started, tape.recorded = True, got.size >= 0
            tape.summary.add(got.data.decode(errors="replace").split("\n"))
            if tape.recorded:  # the scrollback was written as the recording started
                self._since[recs[pid].log] = got.mtime
        await self._read_on(host, {pid: (tape, recs[pid].log) for pid, tape in tapes.items() if tape.recorded}, drain)
        unrecorded = [pid for pid, tape in tapes.items() if not tape.recorded]
        screens = await tmux.capture_panes(host, unrecorded) if unrecorded else {}
        for pid in unrecorded:
            tapes[pid].summary = ConsoleSummary()
            tapes[pid].summary.add(screens.get(pid, "").split("\n"))
        for pane in panes:
            if drain or pane.dead:  # read to its end: what waits for a next line gets none
                tapes[pane.pane_id].summary.settle()
        return {
            pane.pane_id: PaneRead(pane, tapes[pane.pane_id].summary, self._since.get(recs[pane.pane_id].log) if tapes[pane.pane_id].recorded else None)
            for pane in panes
        }

    async def read_logs(self, host: Host, logs: dict[str, str], *, drain: bool = False) -> dict[str, ConsoleSummary]:
        """What each file said (by key): a run's console.log, its pane's bytes as its launch
        piped them, read on from where the last reading stopped (whole with `drain`)."""
        tapes = {key: self._logs.get(path) or _Tape(ConsoleSummary()) for key, path in logs.items()}
        self._logs = {logs[key]: tape for key, tape in tapes.items()}  # runs no longer read are forgotten
        await self._read_on(host, {key: (tape, logs[key]) for key, tape in tapes.items()}, drain)
        if drain:
            for tape in tapes.values():
                tape.summary.settle()
        return {key: tape.summary for key, tape in tapes.items()}

    async def _read_on(self, host: Host, files: dict[str, tuple[_Tape, str]], drain: bool) -> None:
        """Fold what each file (key: its tape, its path) gained since its tape's offset, the
        rest of an older segment first where it turned; with `drain`, to its end."""
        while True:
            full = False
            for got in await recording.read(host, [(key, path, tape.offset, tape.inode) for key, (tape, path) in files.items()]):
                lost = got.key.endswith(recording.LOST)
                old = lost or got.key.endswith(recording.OLDER)
                key = got.key.removesuffix(recording.LOST).removesuffix(recording.OLDER)
                if key not in files or got.size < 0:
                    continue  # not written yet
                tape, path = files[key]
                if old:  # the rest of the segment it turned from: read whole, then the live one from 0
                    tape.offset, tape.inode = 0, "-"
                if lost and path in self._since:
                    # A segment went unread (this reader was slower than a whole one): the
                    # lines are whole again only from the end of the older segment kept.
                    self._since[path] = got.mtime
                else:
                    full |= len(got.data) >= recording.READ_BYTES
                    tape.offset, tape.inode = got.start + len(got.data), got.inode
                self._fold(tape, got.data)
            if not (drain and full):
                return

    @staticmethod
    def _fold(tape: _Tape, data: bytes) -> None:
        tape.summary.add_recorded(tape.utf8.decode(data))


def run_pane(reads: list[PaneRead], on_gpu: Collection[int] = ()) -> PaneRead | None:
    """The pane of a session that holds its run: the one whose processes hold GPU memory
    (`on_gpu`: the pane pids whose process trees do), else the one whose text gave steps
    or a loss, else a bar or counter, else the pane a user attaching sees."""
    if not reads:
        return None

    def rank(read: PaneRead) -> tuple:
        s = read.summary
        return (read.pane.pid in on_gpu, s.step is not None or s.loss is not None, s.progress is not None,
                not read.pane.dead, read.pane.active)  # fmt: skip

    return max(reads, key=rank)


async def panes_on_gpu(host: Host, panes: list[tmux.Pane], gpu_pids: Collection[int]) -> set[int]:
    """The pids of `panes` whose process trees hold any of `gpu_pids` (one ps)."""
    if not gpu_pids or not panes:
        return set()
    table = await procs.process_table(host)
    return {pane.pid for pane in panes if procs.process_tree(table, [pane]) & set(gpu_pids)}


async def read_session(host: Host, session: str) -> PaneRead | None:
    """One session's run pane, its recordings read whole; None when there is no such session."""
    its = await tmux.list_panes(host, session)
    reads = await Recordings().read(host, its, drain=True)
    return run_pane(list(reads.values()))
