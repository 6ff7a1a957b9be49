"""The kill: a plan carried out, then proof that the run's GPU memory is released.

Before anything is signalled the kill proves the plan again, on the host: each pid is
still the process the plan named (its start time, in clock ticks) and still descends from
the run's pane, which tmux still names as the session's (`procs.pane_roots`); a pid that
is not is left alone, whatever put it in the plan. The host checks each start time once
more right before the signal. Until the run's tree is empty the kill reads it again,
session and all (`procs.tree_of`): what it forked meanwhile is the run's too, and gets
SIGKILL with what outlived the grace period; it reports stopped only once none is alive.
A journal on the host (backends/runs/stops.py) says what it is about to send before it
sends it, and is closed when the kill is done: a kill cut short is seen by the next
listing.

A torchrun agent in the tree has its workers signalled first: they stop cleanly (the
trainer checkpoints) and the agent, seeing them end, exits 0 itself; SIGTERM to the agent
would make it exit 1 whatever its workers did. Every node of a multi-node run has its
workers get SIGTERM: the trainer's ranks agree on a stop in every step's all-reduce, so
every node stops at the same step whichever signal arrives first, and a trainer already
stopping absorbs a SIGTERM that arrives later (training/loop.py).

Our trainer stops by handing its checkpoint to a writer process of its own session
(training/durable.py), so that its GPU is free before the checkpoint is durable: the kill
leaves that writer alone (it is no process of the run's to wait for), and once the run's
processes are gone waits for the writer's `checkpoint` event. The report gives both
times: the GPU released, the checkpoint durable.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping

from backends import gpu, runs, tmux
from backends.hosts import Host
from backends.kill.plan import (
    AlreadyEnded,
    KillPlan,
    already_ended,
    holders,
    is_writer,
    plan_kill,
)
from backends.kill.report import GpuDelta, KillReport
from backends.logs.logparse import parse_metrics_line
from backends.procs import Proc, pane_roots, process_table, same, tree_of
from backends.runs.stops import Journal
from training.contract import CHECKPOINT, STAGED, STEP

# Arguments: the signal, then "PID STARTED" items. Each pid is signalled only if its
# /proc/PID/stat still shows the start time we listed (field 22, counted after the last
# ')': the name before it may hold spaces and ')'); the pids signalled are printed. `for`
# expands its list once, so `set --` may reuse "$@".
_SIGNAL = r"""
sig=$1; shift; set -f
same=""
for item; do
  pid=${item%% *}; want=${item#* }
  case $pid in ''|*[!0-9]*|0|1) continue ;; esac
  now=$(cat "/proc/$pid/stat" 2>/dev/null) || continue
  set -- ${now##*[)]}
  case $1 in Z|X) continue ;; esac  # a zombie takes a signal but has nothing left to stop
  [ "${20}" = "$want" ] && same="$same $pid"
done
# One kill for all: signalled one by one, a pane's shell dying first hangs up the rest of
# its group before their turn, and they would read as never signalled.
[ -n "$same" ] && kill -s "$sig" -- $same 2>/dev/null
echo $same
"""

GRACE_S = 30.0  # between SIGTERM and SIGKILL: a trainer saves its checkpoint in it

KILL_WAIT_S = 10.0  # after SIGKILL only uninterruptible sleep keeps a process alive

DURABLE_WAIT_S = 120.0  # for a stopped trainer's checkpoint writer, once the run is gone

PANE_EXIT_WAIT_S = 5.0  # tmux marks a pane dead as soon as its pty closes


async def _signal(host: Host, signal: str, known: Mapping[int, int]) -> list[int]:
    """Send `signal` to each known pid still the same process; the pids it reached."""
    if not known:
        return []
    items = [f"{pid} {started}" for pid, started in sorted(known.items())]
    result = await host.run(["sh", "-c", _SIGNAL, "sh", signal, *items])
    return sorted(int(line) for line in result.stdout.split() if line.isdigit())


class _Tree:
    """The run's processes as the kill knows them, read again on each poll: `known`, each
    pid with its start time (the plan's proven ones, then what descends from them), and the
    sessions and groups whose leaders ended while their members live (`leaders`)."""

    def __init__(self, known: dict[int, int], shells: tuple[int, ...]):
        self.known, self.shells, self.leaders = known, set(shells), set(known)

    def read(self, table: dict[int, Proc]) -> tuple[list[int], dict[int, int]]:
        """(the run's live processes but the checkpoint writer, those first seen now)."""
        alive = same(table, self.known)
        tree = tree_of(table, alive, self.leaders) - self.shells
        fresh = {pid: table[pid].started for pid in tree if pid not in alive}
        self.known.update(fresh)
        # A leader's session or group is followed while it has members (its id cannot be
        # given to a new process meanwhile) and its pid is no one else's.
        members = {i for p in table.values() if not p.zombie for i in (p.sid, p.pgid)}
        others = {pid for pid, p in table.items() if not p.zombie and self.known.get(pid) != p.started}
        self.leaders = ((self.leaders | set(alive)) & members) - others
        return [pid for pid in same(table, self.known) if not is_writer(table[pid])], fresh


async def _wait_exit(host: Host, tree: _Tree, timeout: float, poll_s: float, signal: str | None = None) -> tuple[list[int], list[int]]:
    """Poll until none of the run's processes is alive: (those still alive at the timeout,
    those `signal` was sent to as they were first seen). Without `signal` what the run
    forks meanwhile is only waited for (its trainer's checkpoint writer, which ignores
    SIGTERM once it has started, would not live to ignore it)."""
    deadline, sent = time.monotonic() + timeout, []
    while True:
        alive, fresh = tree.read(await process_table(host))
        if signal and (due := {pid: tree.known[pid] for pid in fresh if pid in alive}):
            sent += await _signal(host, signal, due)
        if not alive or time.monotonic() >= deadline:
            return alive, sent
        await asyncio.sleep(poll_s)


async def _proven(host: Host, plan: KillPlan) -> tuple[dict[int, int], list[int]]:
    """(the plan's processes that are, right now, the processes it named and descend from
    the run's panes as tmux names them (or from the processes its journal names, for a
    plan finishing a stop cut short), the plan's pids alive as anything else). The pane's
    interactive shell is in neither."""
    table = await process_table(host)
    roots = same(table, plan.roots)
    if plan.session is not None and not plan.journaled:
        roots = {pid: t for pid, t in roots.items() if pid in await pane_roots(host, plan.session)}
    tree = tree_of(table, roots)
    proven = {pid: t for pid, t in same(table, plan.tree).items() if pid in tree and pid not in plan.shells}
    return proven, sorted(pid for pid in plan.tree if pid in table and not table[pid].zombie and pid not in {*proven, *plan.shells})


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
    on_signalled: Callable[[list[int]], None] | None = None,
) -> KillReport:
    """Carry out a plan (or the plan of a run id or session name, made now with `hosts`
    and `smis` as plan_kill takes them): SIGTERM to its processes (torchrun's workers first),
    SIGKILL to what outlives `grace_s`, close its session, then poll until none of them
    holds GPU memory. A multi-node plan's nodes are stopped together, each on its host;
    their reports are the report's `nodes`. `on_released` is called once every node's
    processes are gone and its GPU memory checked, before the wait for the trainer's
    checkpoint to be durable: what needs only the GPU (a relaunch that does not resume)
    starts then. `on_signalled` (a plan on one host) is called with the processes that got
    SIGTERM and are to be waited for, the moment they got it: what can wait for them to
    end itself (a trainer started with `--after-pids`) starts then.

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

    # Every node sends its SIGTERM once all have read their GPUs: a node that read slower
    # and signalled later found its workers already stopped by the others (the trainer's
    # all-reduce ends every rank at the same step) and signalled torchrun's agent instead.
    together = asyncio.Barrier(waiting)

    async def node(one: KillPlan) -> KillReport | AlreadyEnded:
        try:
            signalled = on_signalled if one is plan and not plan.nodes else None
            return await _kill_node(one.via or host, one, grace_s, poll_s, one.smi or smi, gpu_timeout_s, nvml,
                                    durable_timeout_s, released, together, signalled)  # fmt: skip
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
        tail = [e for e in map(parse_metrics_line, result.stdout.split("\n")) if e is not None]
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
        gone = writer is None or writer.zombie or not is_writer(writer)
        if not gone:
            await asyncio.sleep(max(poll_s, 0.1))


async def _kill_node(host, plan, grace_s, poll_s, smi, gpu_timeout_s, nvml, durable_timeout_s, released,
                     together: asyncio.Barrier, on_signalled: Callable[[list[int]], None] | None = None) -> KillReport:
    """One host's part of a kill; its signals go out when `together` lets every node's."""
    started = time.monotonic()
    try:
        proven, refused = await _proven(host, plan)
        if proven:  # before any signal: a kill cut short from here on is seen by the next listing
            journal = await Journal.open(host, target=plan.target, session=plan.session, run_id=plan.run_id, tree=proven, signal="TERM")
        before = await gpu.read_gpus(host, smi, nvml=nvml)
    finally:
        await together.wait()
    first = {pid: proven[pid] for pid in plan.first if pid in proven}
    signalled = await _signal(host, "TERM", first or proven)
    if first and not signalled:  # the workers are gone: the agent and its shell get it
        first, signalled = {}, await _signal(host, "TERM", proven)
    # The rest of the tree is waited for too: torchrun's agent and the pane's shell end on
    # their own once the workers have, and get SIGKILL with them if they do not.
    tree = _Tree(same(await process_table(host), proven) | {pid: proven[pid] for pid in signalled}, plan.shells)
    if not tree.known:
        if proven:
            await journal.close()
        panes = [p for p in await tmux.list_panes(host, plan.session) if p.pid in plan.pane_pids] if plan.session else []
        raise await already_ended(host, plan.target, plan.session, plan.manifest, panes)
    if on_signalled is not None:
        on_signalled(sorted(tree.known))
    alive, _ = await _wait_exit(host, tree, grace_s, poll_s)
    killed = []
    if alive:
        await journal.signal("KILL", tree.known)
        killed = await _signal(host, "KILL", {pid: tree.known[pid] for pid in alive})
        alive, late = await _wait_exit(host, tree, KILL_WAIT_S, poll_s, "KILL")
        killed = sorted({*killed, *late})
    known = tree.known
    gpu_before = _run_gpu_processes(before, set(known))
    last_exit = time.monotonic()

    # Ending the session and verifying the GPUs are independent: overlap them, so the
    # release is seen as soon as the driver frees the memory.
    (after, stragglers, verified), exit_status = await asyncio.gather(
        _verify_release(host, smi, nvml, set(known), gpu_timeout_s, poll_s),
        _end_session(host, plan, killed, poll_s),
    )
    await journal.close()
    released()
    checkpoint, step, durable_at = await _wait_durable(host, plan, last_exit, durable_timeout_s, poll_s)
    done = time.monotonic()
    usable = after.status in (gpu.GpuStatus.OK, gpu.GpuStatus.NO_GPU, gpu.GpuStatus.NO_SMI)
    before_mib = {g.index: g.mem_used_mib for g in before.gpus}
    notes = list(plan.notes)
    if journal.error:
        notes.append(f"its journal {journal.path} could not be written ({journal.error}): a stop cut short would not have been seen")
    if refused:
        notes.append(f"left alone: {' '.join(map(str, refused))}, not the processes planned or not descended from the run's pane")
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
        other_holders=holders(after, set(known)),
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
