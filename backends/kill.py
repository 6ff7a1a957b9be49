"""Scoped kill: a plan that names a run's own processes, that plan carried out, then proof
that the run's GPU memory is released.

The plan is what a confirmation shows and exactly what the kill signals: the process trees
of the run's tmux panes (`backends.procs`), each pid with its start time. The host checks
each start time again right before signalling that pid, so a pid reused meanwhile by an
unrelated process is left alone. Nothing else is ever signalled.

A torchrun agent in the tree has its workers signalled first: they stop cleanly (the
trainer checkpoints) and the agent, seeing them end, exits 0 itself; SIGTERM to the agent
would make it exit 1 whatever its workers did. A multi-node run's plan holds one plan per
node, each on its own host (backends/nodes.py launches them), and every node's workers
get SIGTERM: the trainer's ranks agree on a stop in every step's all-reduce, so every
node stops at the same step whichever signal arrives first, and a trainer already
stopping absorbs a SIGTERM that arrives later (training/loop.py).

Our trainer stops by handing its checkpoint to a writer process of its own session
(training/durable.py), so that its GPU is free before the checkpoint is durable: the kill
leaves that writer alone (it is no process of the run's to wait for), and once the run's
processes are gone waits for the writer's `checkpoint` event. The report gives both
times: the GPU released, the checkpoint durable.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import posixpath
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field

from backends import gpu, runs, tmux
from backends.hosts import Host
from backends.own_session import own_sessions
from backends.procs import Proc, descendants, process_table, process_tree, shell_jobs
from training.contract import CHECKPOINT, STAGED, STEP, WRITER_NAME

# Arguments: the signal, then "PID STARTED" items. Each pid is signalled only if ps still
# shows the start time we listed (words compared, so ps's padding does not matter); the
# pids signalled are printed. `for` expands its list once, so `set --` may reuse "$@".
_SIGNAL = r"""
sig=$1; shift; set -f
same=""
for item; do
  pid=${item%% *}; want=${item#* }
  now=$(ps -o stat=,lstart= -p "$pid") || continue
  set -- $now
  case $1 in Z*) continue ;; esac  # a zombie takes a signal but has nothing left to stop
  shift
  [ "$*" = "$want" ] && same="$same $pid"
done
# One kill for all: signalled one by one, a pane's shell dying first hangs up the rest of
# its group before their turn, and they would read as never signalled.
[ -n "$same" ] && kill -s "$sig" -- $same 2>/dev/null
echo $same
"""
# "PID ARGS" for each pid given: the command lines, to find a torchrun agent in a tree;
# whole (-ww), whatever $COLUMNS says (ps cuts them to it: a long venv path hid torchrun).
_ARGS = ["ps", "-ww", "-o", "pid=,args=", "-p"]
GRACE_S = 30.0  # between SIGTERM and SIGKILL: a trainer saves its checkpoint in it
KILL_WAIT_S = 10.0  # after SIGKILL only uninterruptible sleep keeps a process alive
DURABLE_WAIT_S = 120.0  # for a stopped trainer's checkpoint writer, once the run is gone
PANE_EXIT_WAIT_S = 5.0  # tmux marks a pane dead as soon as its pty closes


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
    tree: dict[int, str]  # every pid to signal, with its start time (its identity)
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

    @property
    def pids(self) -> list[int]:
        return sorted(self.tree)


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
    signalled: list[int]  # got SIGTERM: the plan's processes still the same at the signal
    killed: list[int]  # still alive after the grace period: got SIGKILL
    survivors: list[int]  # alive even after SIGKILL
    gpus: list[GpuDelta]
    gpu_processes_before: list[gpu.GpuProcess]  # the run's processes holding GPU memory
    stragglers: list[gpu.GpuProcess]  # the run's processes still holding memory at the end
    # Processes outside the run holding GPU memory at the end: named, never signalled, and
    # no bar to `released`, which speaks of the run's pids only.
    other_holders: list[gpu.GpuProcess]
    released: bool | None  # None: no nvidia-smi to verify it with
    gpu_status: str
    gpu_message: str
    exit_status: int | None
    seconds: float  # the whole kill, first signal to verified release
    release_s: float | None  # last process exit to verified GPU release
    gpu_released_s: float | None = None  # first signal to verified GPU release
    # The trainer's last checkpoint: "durable", "lost" (its writer ended without it), "none
    # written", "not durable after N s", or None: not waited (not our trainer's node).
    checkpoint: str | None = None
    checkpoint_step: int | None = None
    checkpoint_durable_s: float | None = None  # first signal to the checkpoint seen durable
    notes: list[str] = field(default_factory=list)
    host: str | None = None
    nodes: list[KillReport] = field(default_factory=list)  # a multi-node run's other nodes

    def to_json(self) -> dict:
        return asdict(self)

    def verdict(self) -> str:
        """What the kill proved about the run's GPU memory, in words true on this host."""
        if self.survivors:
            return f"NOT released: {len(self.survivors)} process(es) still alive after SIGKILL"
        if self.stragglers:
            return "NOT released: the run's processes above still hold GPU memory"
        if self.gpu_status == gpu.GpuStatus.NO_GPU.name:
            return "stopped; no GPU on this host: no GPU memory to verify"
        if self.gpu_status == gpu.GpuStatus.NO_SMI.name:
            return "stopped; no nvidia-smi on this host: no GPU memory to verify"
        if self.released is False:
            return f"stopped, but GPU memory NOT verified: {self.gpu_message or self.gpu_status}"
        return f"released: the run holds no GPU memory (verified {self.release_s:.2f}s after its last process exited)"

    def times(self) -> str | None:
        """When the GPU was free and the checkpoint durable, counted from the first signal."""
        # "GPU released" only where the release was seen; elsewhere the run's processes ended.
        freed = "GPU released" if self.gpu_status == gpu.GpuStatus.OK.name else "processes ended"
        gpu_free = f"{freed} {self.gpu_released_s:.1f}s" if self.gpu_released_s is not None else None
        if self.checkpoint == "durable":
            written = f"checkpoint step {self.checkpoint_step} durable {self.checkpoint_durable_s:.1f}s"
        elif self.checkpoint is not None:
            written = f"checkpoint {self.checkpoint}" + (f" (step {self.checkpoint_step})" if self.checkpoint_step is not None else "")
        else:
            written = None
        said = [t for t in (gpu_free, written) if t]
        return ", ".join(said) + " after SIGTERM" if said else None


def holding(p: gpu.GpuProcess) -> str:
    """A process's hold on GPU memory in words: `pid 7 (python3) on GPU 1, 2,048 MiB`."""
    name = f" ({p.name})" if p.name else ""
    where = f"GPU {p.gpu_index}" if p.gpu_index is not None else "an unlisted GPU"
    used = f"{p.used_mib:,} MiB" if p.used_mib is not None else "memory the driver does not size"
    return f"pid {p.pid}{name} on {where}, {used}"


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


async def _ended(host: Host, target: str, session: str | None, manifest: dict | None, panes: list[tmux.Pane]) -> AlreadyEnded:
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
    if session in await own_sessions(host, session_panes):
        raise SelfKill(f"refusing to stop {target}: this trackside runs in its tmux session {session}")
    table = await process_table(host)
    pids, shells = set(), []
    for pane in panes:
        jobs = shell_jobs(table, pane)
        if jobs is None:
            pids |= process_tree(table, [pane])
        else:  # typed at an interactive shell: the job stops, the shell and its scrollback stay
            pids |= jobs
            shells.append(pane.pid)
    tree = {pid: table[pid].started for pid in pids if pid in table and not _is_writer(table[pid])}
    if not tree:
        raise await _ended(host, target, session, manifest, panes)
    snapshot = await gpu.read_gpus(host, smi, nvml=nvml)
    holdings = tuple(p for p in snapshot.processes if p.pid in tree)
    held_on = {p.gpu_index for p in holdings}
    bystanders = tuple(p for p in _holders(snapshot, set(tree)) if p.gpu_index in held_on)
    closes = not shells and {p.pid for p in session_panes} <= {p.pid for p in panes}
    if shells:
        notes = (f"it runs as a job of the shell {', '.join(map(str, shells))}: that shell and tmux session {session} stay open",)
    elif not closes:
        notes = (f"tmux session {session} has other panes: they are left running and the session stays open",)
    else:
        notes = ()
    return KillPlan(
        host.name, target, session, manifest["run_id"] if manifest else None, tuple(p.pid for p in panes), tree,
        holdings, bystanders, snapshot.status.name, snapshot.message, closes, notes, manifest,
        first=await _torchrun_workers(host, table, set(tree)), via=host, smi=smi, shells=tuple(shells),
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


async def _signal(host: Host, signal: str, known: dict[int, str]) -> list[int]:
    """Send `signal` to each known pid still the same process; the pids it reached."""
    if not known:
        return []
    items = [f"{pid} {started}" for pid, started in sorted(known.items())]
    result = await host.run(["sh", "-c", _SIGNAL, "sh", signal, *items])
    return sorted(int(line) for line in result.stdout.split() if line.isdigit())


def _is_writer(proc: Proc) -> bool:
    """Our trainer's checkpoint writer: detached on purpose, to outlive the run."""
    return proc.command == WRITER_NAME and proc.sid == proc.pid


def _same(table: dict[int, Proc], known: dict[int, str]) -> list[int]:
    """The known pids still alive as the same process (same start time)."""
    return sorted(pid for pid, started in known.items() if pid in table and not table[pid].zombie and table[pid].started == started)


async def _wait_exit(host: Host, known: dict[int, str], strangers: set[int], timeout: float, poll_s: float) -> list[int]:
    """Poll until none of the run's processes is alive; those still alive at the timeout.

    Children forked meanwhile by a live process of the run join `known` (their parent's
    identity is checked, so a reused pid never brings in a stranger's children), except
    `strangers`: pids the plan named that were no longer the process it named.
    """
    deadline = time.monotonic() + timeout
    while True:
        table = await process_table(host)
        for pid in descendants(table, set(_same(table, known))) - strangers:
            known.setdefault(pid, table[pid].started)
        alive = [pid for pid in _same(table, known) if not _is_writer(table[pid])]
        if not alive or time.monotonic() >= deadline:
            return alive
        await asyncio.sleep(poll_s)


async def _pane_exit_status(host: Host, session: str, pane_pid: int, poll_s: float) -> int | None:
    """The pane's exit status once tmux has seen its process end (None if tmux has none)."""
    deadline = time.monotonic() + PANE_EXIT_WAIT_S
    while time.monotonic() < deadline:
        panes = [p for p in await tmux.list_panes(host, session) if p.pid == pane_pid]
        if not panes or panes[0].dead:
            return panes[0].exit_status if panes else None
        await asyncio.sleep(poll_s)
    return None


async def _end_session(host: Host, plan: KillPlan, killed: list[int], poll_s: float) -> int | None:
    """Record how the run ended, then close its session if it holds nothing else; the
    exit status.

    Our runs record their own status; when SIGKILL took the recording shell too, that
    is the answer; otherwise tmux's view of the (first) pane.
    """
    exit_status = None
    if plan.manifest:
        exit_status = await runs.read_exit_status(host, plan.manifest["run_dir"])
        if exit_status is None and plan.manifest.get("pane_pid") in killed:
            exit_status = -9
    if exit_status is None and plan.pane_pids and plan.pane_pids[0] not in plan.shells:
        exit_status = await _pane_exit_status(host, plan.session, plan.pane_pids[0], poll_s)
    if plan.pane_pids and plan.closes_session:
        await tmux.kill_session(host, plan.session)
    if plan.manifest:
        await runs.record_end(host, plan.manifest, exit_status)
    return exit_status


def _run_gpu_processes(snapshot: gpu.GpuSnapshot, pids: set[int]) -> list[gpu.GpuProcess]:
    return [p for p in snapshot.processes if p.pid in pids and (p.used_mib or 0) > 0]


def _holders(snapshot: gpu.GpuSnapshot, pids: set[int]) -> list[gpu.GpuProcess]:
    """Processes outside `pids` holding GPU memory."""
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
    plan: KillPlan | str,
    grace_s: float = GRACE_S,
    poll_s: float = 0.05,
    smi: str = gpu.DEFAULT_SMI,
    gpu_timeout_s: float = 10.0,
    nvml: bool = True,
    hosts: Mapping[str, Host] | None = None,
    smis: Mapping[str, str] | None = None,
    durable_timeout_s: float = DURABLE_WAIT_S,
    on_released: Callable[[], None] | None = None,
) -> KillReport:
    """Carry out a plan (or the plan of a run id or session name, made now with `hosts`
    and `smis` as plan_kill takes them): SIGTERM to its processes (torchrun's workers first),
    SIGKILL to what outlives `grace_s`, close its session, then poll until none of them
    holds GPU memory. A multi-node plan's nodes are stopped together, each on its host;
    their reports are the report's `nodes`. `on_released` is called once every node's
    processes are gone and its GPU memory checked, before the wait for the trainer's
    checkpoint to be durable: what needs only the GPU (a relaunch that does not resume)
    starts then.

    Raises AlreadyEnded, touching nothing, when none of the plan's processes is still
    alive as the same process. GPU memory is read as `gpu.read_gpus` reads it: NVML on
    this machine unless `nvml=False`, else `smi`."""
    if isinstance(plan, str):
        plan = await plan_kill(host, plan, smi=smi, nvml=nvml, hosts=hosts, smis=smis)

    waiting = 1 + len(plan.nodes)  # nodes whose GPUs are still to be let go

    def released() -> None:
        nonlocal waiting
        waiting -= 1
        if waiting == 0 and on_released is not None:
            on_released()

    async def node(one: KillPlan) -> KillReport | AlreadyEnded:
        try:
            return await _kill_node(one.via or host, one, grace_s, poll_s, one.smi or smi, gpu_timeout_s, nvml,
                                    durable_timeout_s, released)  # fmt: skip
        except AlreadyEnded as ended:  # ended meanwhile: the others are still to be stopped
            released()
            return ended

    head, *rest = await asyncio.gather(node(plan), *(node(one) for one in plan.nodes))
    reports = [r for r in rest if isinstance(r, KillReport)]
    ended = [f"node on {one.host}: {r}" for one, r in zip(plan.nodes, rest) if isinstance(r, AlreadyEnded)]
    if isinstance(head, AlreadyEnded):
        if not reports:
            raise head
        head, reports = reports[0], reports[1:]
    head.nodes = reports
    head.notes += ended
    return head


async def _wait_durable(host: Host, plan: KillPlan, exited: float, timeout: float, poll_s: float) -> tuple[str | None, int | None, float | None]:
    """(what became of the trainer's last checkpoint, its step, when it was seen durable).
    Read from the events after the run's last step: a `staged` one is waited for (its
    `checkpoint` event, or its writer gone without one); a `checkpoint` one was durable
    when the trainer exited. Not waited where this host's run dir has no events (not our
    trainer, or a node that does not write them)."""
    if not plan.manifest or not plan.manifest.get("trainer"):
        return None, None, None
    deadline, gone = time.monotonic() + timeout, False
    while True:
        result = await host.run(["tail", "-n", "8", f"{plan.manifest['run_dir']}/metrics.jsonl"])
        if not result.ok:
            return None, None, None
        tail = []
        for line in result.stdout.splitlines():
            try:
                tail.append(json.loads(line))
            except ValueError:
                continue
        tail = [e for e in tail if isinstance(e, dict)]
        last = max((i for i, e in enumerate(tail) if e.get("event") == STEP), default=-1)
        staged = next((e for e in tail[last + 1:] if e.get("event") == STAGED), None)
        saved = next((e for e in tail[last + 1:] if e.get("event") == CHECKPOINT), None)
        if saved is not None:
            return "durable", saved.get("step"), exited if staged is None else time.monotonic()
        if staged is None:
            return "none written", None, None
        if gone:  # read again after the writer was seen gone: it wrote no event
            return "lost", staged.get("step"), None
        if time.monotonic() >= deadline:
            return f"not durable after {timeout:.0f}s", staged.get("step"), None
        writer = (await process_table(host)).get(staged.get("writer"))
        gone = writer is None or writer.zombie or not _is_writer(writer)
        if not gone:
            await asyncio.sleep(max(poll_s, 0.1))


async def _kill_node(host, plan, grace_s, poll_s, smi, gpu_timeout_s, nvml, durable_timeout_s, released) -> KillReport:
    """One host's part of a kill."""
    started = time.monotonic()
    before = await gpu.read_gpus(host, smi, nvml=nvml)
    first = {pid: plan.tree[pid] for pid in plan.first}
    signalled = await _signal(host, "TERM", first or plan.tree)
    if first and not signalled:  # the workers are gone: the agent and its shell get it
        first, signalled = {}, await _signal(host, "TERM", plan.tree)
    # The rest of the tree is waited for too: torchrun's agent and the pane's shell end on
    # their own once the workers have, and get SIGKILL with them if they do not.
    table = await process_table(host)
    known = {pid: plan.tree[pid] for pid in {*signalled, *_same(table, plan.tree)}}
    if not known:
        panes = [p for p in await tmux.list_panes(host, plan.session) if p.pid in plan.pane_pids] if plan.session else []
        raise await _ended(host, plan.target, plan.session, plan.manifest, panes)
    strangers = set(plan.tree) - set(known)
    gpu_before = _run_gpu_processes(before, set(known))
    alive = await _wait_exit(host, known, strangers, grace_s, poll_s)
    killed = []
    if alive:
        killed = await _signal(host, "KILL", {pid: known[pid] for pid in alive})
        alive = await _wait_exit(host, known, strangers, KILL_WAIT_S, poll_s)
    last_exit = time.monotonic()

    # Ending the session and verifying the GPUs are independent: overlap them, so the
    # release is seen as soon as the driver frees the memory.
    (after, stragglers, verified), exit_status = await asyncio.gather(
        _verify_release(host, smi, nvml, set(known), gpu_timeout_s, poll_s),
        _end_session(host, plan, killed, poll_s),
    )
    released()
    checkpoint, step, durable_at = await _wait_durable(host, plan, last_exit, durable_timeout_s, poll_s)
    done = time.monotonic()
    usable = after.status in (gpu.GpuStatus.OK, gpu.GpuStatus.NO_GPU, gpu.GpuStatus.NO_SMI)
    before_mib = {g.index: g.mem_used_mib for g in before.gpus}
    notes = list(plan.notes)
    if first:
        notes.append(f"torchrun's {len(first)} worker(s) got SIGTERM first; its agent and the pane's shell were left to end after them")
    return KillReport(
        target=plan.target,
        session=plan.session,
        run_id=plan.run_id,
        signalled=signalled,
        killed=killed,
        survivors=alive,
        gpus=[GpuDelta(g.index, before_mib.get(g.index), g.mem_used_mib) for g in after.gpus],
        gpu_processes_before=gpu_before,
        stragglers=stragglers,
        other_holders=_holders(after, set(known)),
        # None: nothing could check (no nvidia-smi on the host): unverified, not released.
        released=None if after.status is gpu.GpuStatus.NO_SMI and not alive else usable and not stragglers and not alive,
        gpu_status=after.status.name,
        gpu_message=after.message,
        exit_status=exit_status,
        seconds=done - started,
        release_s=None if alive or stragglers or not usable else verified - last_exit,
        # Unverified (no GPU, no nvidia-smi), the run's last exit is when it let go.
        gpu_released_s=None if alive or stragglers or not usable else (verified if after.status is gpu.GpuStatus.OK else last_exit) - started,
        checkpoint=checkpoint,
        checkpoint_step=step,
        checkpoint_durable_s=None if durable_at is None else durable_at - started,
        notes=notes,
        host=host.name,
    )
