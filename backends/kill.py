"""Scoped kill: a run's own process tree, then proof that its GPU memory is released.

The tree is every process in the session of one of the run's tmux panes (tmux makes each
pane's process a session leader), in its process group, and every descendant of those
(which catches workers that left the session with setsid). Nothing else is ever
signalled: each signal goes to pids whose start time still matches what we listed, so a
pid reused by an unrelated process is left alone.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import asdict, dataclass, field

from backends import gpu, runs, tmux
from backends.hosts import Host, HostError

# pid ppid pgid sid stat lstart (lstart is 5 words, fixed for a process's life)
_PS = ["ps", "-eo", "pid=,ppid=,pgid=,sid=,stat=,lstart="]
_SIGNAL = 'sig=$1; shift; exec kill -s "$sig" -- "$@"'
KILL_WAIT_S = 10.0  # after SIGKILL only uninterruptible sleep keeps a process alive
PANE_EXIT_WAIT_S = 5.0  # tmux marks a pane dead as soon as its pty closes


class KillError(Exception):
    """The target names no run or session on the host."""


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    pgid: int
    sid: int
    zombie: bool
    started: str


@dataclass(frozen=True)
class GpuDelta:
    index: int
    before_mib: int | None
    after_mib: int | None


@dataclass
class KillReport:
    target: str
    session: str | None
    run_id: str | None
    signalled: list[int]  # got SIGTERM
    killed: list[int]  # still alive after the grace period: got SIGKILL
    survivors: list[int]  # alive even after SIGKILL
    gpus: list[GpuDelta]
    gpu_processes_before: list[gpu.GpuProcess]  # the run's processes holding GPU memory
    stragglers: list[gpu.GpuProcess]  # the run's processes still holding memory at the end
    # Processes outside the run holding GPU memory at the end: named, never signalled, and
    # no bar to `released`, which speaks of the run's pids only.
    other_holders: list[gpu.GpuProcess]
    released: bool
    gpu_status: str
    gpu_message: str
    exit_status: int | None
    seconds: float  # the whole kill, first signal to verified release
    release_s: float | None  # last process exit to verified GPU release
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)


async def process_table(host: Host) -> dict[int, Proc]:
    result = await host.run(_PS)
    if not result.ok:
        raise HostError(host.name, f"ps failed: {result.stderr.strip()}")
    table = {}
    for line in result.stdout.splitlines():
        fields = line.split(None, 5)
        if len(fields) == 6 and all(f.isdigit() for f in fields[:4]):
            pid, ppid, pgid, sid = map(int, fields[:4])
            table[pid] = Proc(pid, ppid, pgid, sid, fields[4].startswith("Z"), " ".join(fields[5].split()))
    return table


def descendants(table: dict[int, Proc], pids: set[int]) -> set[int]:
    """pids and every live descendant of them."""
    children: dict[int, list[int]] = {}
    for p in table.values():
        children.setdefault(p.ppid, []).append(p.pid)
    members, stack = set(pids), list(pids)
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in members:
                members.add(child)
                stack.append(child)
    return {pid for pid in members if pid in table and not table[pid].zombie}


def process_tree(table: dict[int, Proc], panes: list[tmux.Pane]) -> set[int]:
    """Live pids of the panes' sessions and process groups, and all their descendants."""
    roots = set()
    for pane in panes:
        if pane.dead and pane.pid in table:
            continue  # the pane's process is gone and its pid belongs to someone else now
        roots.add(pane.pid)
    return descendants(table, {p.pid for p in table.values() if p.pid in roots or p.sid in roots or p.pgid in roots})


def _same(table: dict[int, Proc], known: dict[int, str]) -> list[int]:
    """The known pids still alive as the same process (same start time)."""
    return sorted(pid for pid, started in known.items() if pid in table and not table[pid].zombie and table[pid].started == started)


async def _signal(host: Host, signal: str, pids: list[int]) -> None:
    if pids:
        # kill fails for pids that exited meanwhile; the polls that follow are the truth.
        await host.run(["sh", "-c", _SIGNAL, "sh", signal, *map(str, pids)])


async def _wait_exit(host: Host, known: dict[int, str], timeout: float, poll_s: float) -> list[int]:
    """Poll until none of the run's processes is alive; those still alive at the timeout.

    Children forked meanwhile by a live process of the run join `known` (their parent's
    identity is checked, so a reused pid never brings in a stranger's children).
    """
    deadline = time.monotonic() + timeout
    while True:
        table = await process_table(host)
        for pid in descendants(table, set(_same(table, known))):
            known.setdefault(pid, table[pid].started)
        alive = _same(table, known)
        if not alive or time.monotonic() >= deadline:
            return alive
        await asyncio.sleep(poll_s)


async def _resolve(host: Host, target: str) -> tuple[str | None, dict | None, list[tmux.Pane]]:
    """(session, manifest, panes) for a run id or a session name."""
    if runs.RUN_ID.fullmatch(target):
        manifest = await runs.read_manifest(host, target)
        session = manifest["session"]
        panes = [p for p in await tmux.list_panes(host, session) if p.pid == manifest.get("pane_pid")]
        return session, manifest, panes
    panes = await tmux.list_panes(host, target)
    if not panes:
        raise KillError(f"no run or tmux session {target!r} on {host.name}")
    ours = [r for r in await runs.list_runs(host) if r.run_id and r.session == target and r.pids]
    manifest = await runs.read_manifest(host, ours[0].run_id) if ours else None
    return target, manifest, panes


async def _pane_exit_status(host: Host, session: str, pane_pid: int, poll_s: float) -> int | None:
    """The pane's exit status once tmux has seen its process end (None if tmux has none)."""
    deadline = time.monotonic() + PANE_EXIT_WAIT_S
    while time.monotonic() < deadline:
        panes = [p for p in await tmux.list_panes(host, session) if p.pid == pane_pid]
        if not panes or panes[0].dead:
            return panes[0].exit_status if panes else None
        await asyncio.sleep(poll_s)
    return None


async def _end_session(host: Host, session: str | None, manifest: dict | None, panes: list[tmux.Pane], killed: list[int], poll_s: float) -> int | None:
    """Record how the run ended, then kill its session; the exit status.

    Our runs record their own status; when SIGKILL took the recording shell too, that
    is the answer; otherwise tmux's view of the (first) pane.
    """
    exit_status = None
    if manifest:
        exit_status = await runs.read_exit_status(host, manifest["run_dir"])
        if exit_status is None and manifest.get("pane_pid") in killed:
            exit_status = -9
    if exit_status is None and panes:
        exit_status = await _pane_exit_status(host, session, panes[0].pid, poll_s)
    if panes:
        await tmux.kill_session(host, session)
    if manifest:
        await runs.record_end(host, manifest, exit_status)
    return exit_status


def _run_gpu_processes(snapshot: gpu.GpuSnapshot, pids: set[int]) -> list[gpu.GpuProcess]:
    return [p for p in snapshot.processes if p.pid in pids and (p.used_mib or 0) > 0]


def _other_holders(snapshot: gpu.GpuSnapshot, pids: set[int]) -> list[gpu.GpuProcess]:
    # used_mib None: the driver lists the process but cannot say how much (some containers).
    return [p for p in snapshot.processes if p.pid not in pids and (p.used_mib is None or p.used_mib > 0)]


async def _verify_release(host, smi, nvml, pids, timeout, poll_s) -> tuple[gpu.GpuSnapshot, list[gpu.GpuProcess], float]:
    """Poll until no pid of the run holds GPU memory: the last snapshot, who still holds
    memory in it, and when it was taken."""
    deadline = time.monotonic() + timeout
    while True:
        snapshot = await gpu.read_gpus(host, smi, nvml=nvml)
        held = _run_gpu_processes(snapshot, pids)
        if not held or time.monotonic() >= deadline:
            return snapshot, held, time.monotonic()
        await asyncio.sleep(poll_s)


async def kill_run(
    host: Host,
    target: str,
    grace_s: float = 30.0,
    poll_s: float = 0.05,
    smi: str = gpu.DEFAULT_SMI,
    gpu_timeout_s: float = 10.0,
    nvml: bool = True,
) -> KillReport:
    """Stop a run (run id or tmux session): SIGTERM its tree, SIGKILL what outlives
    `grace_s`, kill its session, then poll until none of its pids holds GPU memory.

    GPU memory is read as `gpu.read_gpus` reads it: NVML on this machine unless
    `nvml=False`, else `smi`."""
    started = time.monotonic()
    session, manifest, panes = await _resolve(host, target)
    notes = []
    if not panes:
        notes.append(f"session {session} of this run is gone; nothing to signal")
    table = await process_table(host)
    known = {pid: table[pid].started for pid in process_tree(table, panes)}
    if host.is_local and os.getpid() in known:
        raise KillError(f"refusing to kill {target}: trackside itself runs in that tmux session")
    before = await gpu.read_gpus(host, smi, nvml=nvml)
    gpu_before = _run_gpu_processes(before, set(known))

    signalled = sorted(known)
    await _signal(host, "TERM", signalled)
    alive = await _wait_exit(host, known, grace_s, poll_s)
    killed = alive
    if killed:
        await _signal(host, "KILL", killed)
        alive = await _wait_exit(host, known, KILL_WAIT_S, poll_s)
    last_exit = time.monotonic()

    # Ending the session and verifying the GPUs are independent: overlap them, so the
    # release is seen as soon as the driver frees the memory.
    (after, stragglers, verified), exit_status = await asyncio.gather(
        _verify_release(host, smi, nvml, set(known), gpu_timeout_s, poll_s),
        _end_session(host, session, manifest, panes, killed, poll_s),
    )
    done = time.monotonic()
    usable = after.status in (gpu.GpuStatus.OK, gpu.GpuStatus.NO_GPU, gpu.GpuStatus.NO_SMI)
    before_mib = {g.index: g.mem_used_mib for g in before.gpus}
    return KillReport(
        target=target,
        session=session,
        run_id=manifest["run_id"] if manifest else None,
        signalled=signalled,
        killed=killed,
        survivors=alive,
        gpus=[GpuDelta(g.index, before_mib.get(g.index), g.mem_used_mib) for g in after.gpus],
        gpu_processes_before=gpu_before,
        stragglers=stragglers,
        other_holders=_other_holders(after, set(known)),
        released=usable and not stragglers and not alive,
        gpu_status=after.status.name,
        gpu_message=after.message,
        exit_status=exit_status,
        seconds=done - started,
        release_s=None if alive or stragglers or not usable else verified - last_exit,
        notes=notes,
    )
