"""The kill plan: what stopping a run would signal, read before anything is. It is what a
confirmation shows and at most what the kill signals: the process trees of the run's tmux
panes (`backends.procs`), each pid with its start time, what they hold on the GPUs and who
else holds memory there. A tree is rooted only at pids tmux names as the session's live
panes (`procs.pane_roots`), never at a record a process could print, nor at pid 1. A
multi-node run's plan holds one plan per node, each on its own host (backends/nodes/
launches them)."""

from __future__ import annotations

import asyncio
import dataclasses
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field

from backends import gpu, runs, tmux
from backends.hosts import Host
from backends.own_session import own_sessions
from backends.procs import Proc, descendants, pane_roots, process_table, process_tree, shell_jobs, tree_of
from backends.runs.stops import interrupted, stop_of
from training.contract import WRITER_NAME

# "PID ARGS" for each pid given: the command lines, to find a torchrun agent in a tree;
# whole (-ww), whatever $COLUMNS says (ps cuts them to it: a long venv path hid torchrun).
_ARGS = ["ps", "-ww", "-o", "pid=,args=", "-p"]


class KillError(Exception):
    """The target cannot be stopped: it names no run or session, or is refused."""


class SelfKill(KillError):
    """The target's tmux session is the one this trackside runs in."""


class AlreadyEnded(KillError):
    """None of the target's processes is alive: nothing was stopped."""


@dataclass(frozen=True)
class KillPlan:
    host: str
    target: str  # the run id or session name it was asked for
    session: str | None
    run_id: str | None
    pane_pids: tuple[int, ...]
    tree: dict[int, int]  # every pid to signal, with its start time in clock ticks (its identity)
    holdings: tuple[gpu.GpuProcess, ...]  # the tree's processes listed on a GPU, with MiB
    bystanders: tuple[gpu.GpuProcess, ...]  # others holding memory on those GPUs: left alone
    gpu_status: str  # gpu.GpuStatus name of the read behind holdings and bystanders
    gpu_message: str
    closes_session: bool  # the session holds only the run's panes: ending it ends nothing else
    notes: tuple[str, ...] = ()
    manifest: dict | None = field(default=None, repr=False)  # our runs': how to record the end
    first: tuple[int, ...] = ()  # torchrun's workers: signalled before the rest of the tree
    # A multi-node run's other nodes, each a plan of its own host (`via`), in node order.
    nodes: tuple[KillPlan, ...] = ()
    via: Host | None = field(default=None, repr=False, compare=False)
    smi: str | None = None  # the nvidia-smi of this plan's host (nodes' hosts may differ)
    shells: tuple[int, ...] = ()  # panes' interactive shells whose jobs these are: left alone
    # The live panes' processes tmux named, with their start times: what the kill proves
    # the tree's descent from again before it signals anything. `journaled`: instead, the
    # processes a kill cut short had proven the run's (its journal), its panes' ended.
    roots: dict[int, int] = field(default_factory=dict)
    journaled: bool = False

    @property
    def pids(self) -> list[int]:
        return sorted(self.tree)


async def _resolve(host: Host, target: str) -> tuple[str | None, dict | None, list[tmux.Pane], list[tmux.Pane]]:
    """(session, manifest, the target's panes, all its session's panes) for a run id or a
    session name."""
    if runs.RUN_ID.fullmatch(target):
        manifest = await runs.read_manifest(host, target)
        session = manifest["session"]
        session_panes = await tmux.list_panes(host, session)
        return session, manifest, [p for p in session_panes if p.pid == manifest.get("pane_pid")], session_panes
    panes = await tmux.list_panes(host, target)
    if not panes:
        raise KillError(f"no run or tmux session {target!r} on {host.name}")
    # Session names are reused once free: the session is the newest run's of that name,
    # unless the listing calls it foreign (no run's pane in it).
    named = [r for r in await runs.list_runs(host) if r.session == target]
    run_id = None if any(r.run_id is None for r in named) else named[0].run_id if named else None
    manifest = await runs.read_manifest(host, run_id) if run_id else None
    return target, manifest, panes, panes


async def already_ended(host: Host, target: str, session: str | None, manifest: dict | None, panes: list[tmux.Pane]) -> AlreadyEnded:
    """The refusal for a target with no live process, naming how it ended."""
    status = runs.manifest_exit_status(manifest) if manifest else None
    if status is None and manifest:
        status = await runs.read_exit_status(host, manifest["run_dir"])
    if status is None:
        status = next((p.exit_status for p in panes if p.dead and p.exit_status is not None), None)
    how = f"exit status {status}" if status is not None else "exit status unknown"
    where = "" if panes else f"; its tmux session {session} is gone"
    return AlreadyEnded(f"{target} had already ended ({how}{where}): nothing was stopped")


async def plan_kill(
    host: Host,
    target: str,
    *,
    smi: str = gpu.DEFAULT_SMI,
    nvml: bool = True,
    hosts: Mapping[str, Host] | None = None,
    smis: Mapping[str, str] | None = None,
) -> KillPlan:
    """What stopping `target` (a run id or tmux session name) would signal, read now.

    Raises SelfKill for the session this trackside runs in, AlreadyEnded when none of the
    target's processes is alive, KillError when it names nothing. GPU memory is read as
    `gpu.read_gpus` reads it (`smi`, `nvml`).

    With `hosts` (name: Host), a multi-node run's plan covers every node: the first node
    still alive heads it, the others are its `nodes`, and a node that had already ended
    is a note. `smis` names the nvidia-smi of hosts that have their own."""
    session, manifest, panes, session_panes = await _resolve(host, target)
    spans = (manifest or {}).get("nodes") or []
    if hosts is None or len(spans) < 2:
        return await _plan_node(host, target, session, manifest, panes, session_panes, (smis or {}).get(host.name, smi), nvml)
    missing = [n["host"] for n in spans if n["host"] not in hosts and n["host"] != host.name]
    if missing:
        raise KillError(f"run {manifest['run_id']} has nodes on {', '.join(missing)}, not hosts of the config: nothing was stopped")

    async def node(entry: dict) -> KillPlan | AlreadyEnded:
        on = host if entry["host"] == host.name else hosts[entry["host"]]
        try:
            found = await _resolve(on, manifest["run_id"])
            return await _plan_node(on, target, *found, (smis or {}).get(on.name, smi), nvml)
        except AlreadyEnded as ended:
            return ended

    plans = await asyncio.gather(*(node(entry) for entry in spans))
    alive = [p for p in plans if isinstance(p, KillPlan)]
    ended = tuple(f"node {i} on {spans[i]['host']}: {p}" for i, p in enumerate(plans) if isinstance(p, AlreadyEnded))
    if not alive:
        raise AlreadyEnded(f"{target} had already ended on every node ({'; '.join(ended)})")
    head, *rest = alive
    return dataclasses.replace(head, nodes=tuple(rest), notes=head.notes + ended)


async def _plan_node(host, target, session, manifest, panes, session_panes, smi, nvml) -> KillPlan:
    """The plan on one host: its panes' process trees and what they hold on its GPUs."""
    table = await process_table(host)
    # Read after the table: a pid tmux still names as a live pane is the process the
    # table holds (tmux marks a pane dead when its process ends, before the pid is free).
    roots = await pane_roots(host, session) if session is not None else set()
    panes, session_panes = [p for p in panes if p.dead or p.pid in roots], [p for p in session_panes if p.dead or p.pid in roots]
    if session in await own_sessions(host, session_panes):
        raise SelfKill(f"refusing to stop {target}: this trackside runs in its tmux session {session}")
    pids, shells = set(), []
    for pane in panes:
        jobs = shell_jobs(table, pane)
        if jobs is None:
            pids |= process_tree(table, [pane])
        else:  # typed at an interactive shell: the job stops, the shell and its scrollback stay
            pids |= jobs
            shells.append(pane.pid)
    tree = {pid: table[pid].started for pid in pids if pid in table and not is_writer(table[pid])}
    roots, journaled = {p.pid: table[p.pid].started for p in panes if not p.dead and p.pid in table}, False
    if not tree and (stop := stop_of(await interrupted(host), manifest["run_id"] if manifest else None, session or target)):
        # A stop cut short after the pane's process ended: what it had proven the run's
        # (its journal, this user's alone) and still lives, and what descends from that.
        roots, journaled = stop["tree"], True
        tree = {pid: table[pid].started for pid in tree_of(table, roots) if not is_writer(table[pid])}
    if not tree:
        raise await already_ended(host, target, session, manifest, panes)
    snapshot = await gpu.read_gpus(host, smi, nvml=nvml)
    holdings = tuple(p for p in snapshot.processes if p.pid in tree)
    held_on = {p.gpu_index for p in holdings}
    bystanders = tuple(p for p in holders(snapshot, set(tree)) if p.gpu_index in held_on)
    closes = not shells and {p.pid for p in session_panes} <= {p.pid for p in panes}
    if shells:
        notes = (f"it runs as a job of the shell {', '.join(map(str, shells))}: that shell and tmux session {session} stay open",)
    elif not closes:
        notes = (f"tmux session {session} has other panes: they are left running and the session stays open",)
    else:
        notes = ()
    if journaled:
        notes += (f"finishing a stop that was cut short: {len(tree)} of its processes still live",)
    return KillPlan(
        host.name, target, session, manifest["run_id"] if manifest else None, tuple(p.pid for p in panes), tree,
        holdings, bystanders, snapshot.status.name, snapshot.message, closes, notes, manifest,
        first=await _torchrun_workers(host, table, set(tree)), via=host, smi=smi, shells=tuple(shells),
        roots=roots, journaled=journaled,
    )  # fmt: skip


def _is_torchrun(args: list[str]) -> bool:
    return any(posixpath.basename(a) == "torchrun" for a in args) or any(
        args[i : i + 2] == ["-m", "torch.distributed.run"] for i in range(len(args) - 1)
    )


async def _torchrun_workers(host: Host, table: dict[int, Proc], tree: set[int]) -> tuple[int, ...]:
    """The workers of a torchrun agent in the tree: the children of the deepest process
    whose command line runs torchrun (the pane's shell and a host prefix name it too)."""
    result = await host.run([*_ARGS, ",".join(map(str, sorted(tree)))])
    named = set()
    for line in result.stdout.splitlines():
        pid, _, args = line.strip().partition(" ")
        if pid.isdigit() and int(pid) in tree and _is_torchrun(args.split()):
            named.add(int(pid))
    agents = {pid for pid in named if not (descendants(table, {pid}) - {pid}) & named}
    return tuple(sorted(p for p in tree if table[p].ppid in agents))


def is_writer(proc: Proc) -> bool:
    """Our trainer's checkpoint writer: detached on purpose, to outlive the run."""
    return proc.command == WRITER_NAME and proc.sid == proc.pid


def holders(snapshot: gpu.GpuSnapshot, pids: set[int]) -> list[gpu.GpuProcess]:
    """Processes outside `pids` holding GPU memory."""
    # used_mib None: the driver lists the process but cannot say how much (some containers).
    return [p for p in snapshot.processes if p.pid not in pids and (p.used_mib is None or p.used_mib > 0)]
