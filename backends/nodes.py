"""Multi-node runs: one trainer run spread over several hosts as one torchrun job.

Every host runs torchrun with c10d rendezvous: the run id as the rendezvous id, the first
host's address as endpoint (its agent serves the rendezvous store), `--nnodes` the number
of hosts. Each node is an ordinary run on its host — its own tmux session and run dir
`<that host's runs_root>/<run id>/` (no shared filesystem is assumed) — whose manifest
also names every node (`nodes`), its own place among them (`node`), `nproc_per_node` and
`rdzv_endpoint`. Only global rank 0 writes metrics.jsonl and checkpoints, so one node's
run dir holds the run's metrics: the node the rendezvous gave rank 0, which c10d picks by
address (it ignores `--node-rank`), not necessarily node 0.

Here: launching and relaunching every node (`launch_nodes`, `relaunch_nodes`), one
listing entry per run spanning hosts (`merge`, `list_spanning`), and the rule for a node
that died while the others still run (`stop_orphans`, `node_alert`): the others would
wait on it in a collective (NCCL's wait is long), so they are stopped. `trackside watch`
applies that rule on every poll; a listing never stops anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import posixpath
import re
import signal
from collections.abc import Mapping, Sequence
from functools import partial

from backends import gpu, kill
from backends import params as run_params
from backends.alerts import Alert
from backends.hosts import Host, HostError
from backends.runs import (
    STARTUP_S,
    Launched,
    NodeInfo,
    RunError,
    RunInfo,
    RunPhase,
    launch,
    launch_command,
    launcher_code,
    list_runs,
    parent_session_name,
    read_manifest,
    resolve_program,
    run_dir,
    session_name,
    train_args_start,
)
from training.contract import new_run_id

# torchrun's summary of a failed job: the first failed worker's rank and exit code.
_ROOT_CAUSE = re.compile(r"Root Cause.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.DOTALL)
CONSOLE_TAIL_BYTES = 65536

# A port free on the host now, for the rendezvous store (run by the trainer's python).
_FREE_PORT = "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])"


def torchrun_command(command: list[str], *, nnodes: int, nproc_per_node: int, endpoint: str, run_id: str, serves: bool) -> list[str]:
    """The resolved trainer command run as one node of a torchrun job.

    `python -m training train …` becomes `python -m torch.distributed.run OPTS -m training
    train …`; `/…/bin/trackside train …` runs under the `torchrun` beside it. `serves`:
    this node's agent hosts the rendezvous store (said outright: on one machine every node
    would otherwise try to)."""
    opts = [
        "--nnodes", str(nnodes), "--nproc-per-node", str(nproc_per_node), "--rdzv-backend", "c10d",
        "--rdzv-endpoint", endpoint, "--rdzv-id", run_id, "--rdzv-conf", f"is_host={str(serves).lower()}",
        "--max-restarts", "0",
    ]  # fmt: skip
    for i in range(len(command) - 2):
        if command[i : i + 3] == ["-m", "training", "train"]:
            return [*command[:i], "-m", "torch.distributed.run", *opts, *command[i:]]
    if posixpath.isabs(command[0]) and command[1:2] == ["train"]:
        return [posixpath.join(posixpath.dirname(command[0]), "torchrun"), *opts, *command]
    raise RunError(f"cannot run {command[0]} under torchrun: give `trackside train …` or `python -m training train …`")


def _python(command: list[str]) -> str:
    """The interpreter of a resolved trainer command: its own (`python -m training`) or
    the one beside the `trackside` script."""
    if "-m" in command:
        return command[0]
    return posixpath.join(posixpath.dirname(command[0]), "python")


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


def rendezvous_host(hosts: Sequence[Host]) -> str:
    """The first host's address, as the other nodes reach it. This machine is 127.0.0.1
    only when every host is this machine."""
    first = hosts[0]
    address = getattr(first, "address", None)
    if address:
        return address
    if all(_loopback(getattr(h, "address", None) or "127.0.0.1") for h in hosts):
        return "127.0.0.1"
    raise RunError(
        f"{first.name} is this machine, which the other hosts cannot reach as 127.0.0.1: "
        "put a remote host first or give the address they reach it by (--rdzv-host)"
    )


async def _free_port(host: Host, python: str) -> int:
    result = await host.run([python, "-c", _FREE_PORT])
    if not result.ok or not result.stdout.strip().isdigit():
        raise RunError(f"cannot find a free port for the rendezvous on {host.name} with {python}: {result.stderr.strip()}")
    return int(result.stdout)


async def launch_nodes(
    hosts: Sequence[Host],
    argv: Sequence[str],
    nproc_per_node: int,
    *,
    train_commands: Mapping[str, Sequence[str]] | None = None,
    params: dict | None = None,
    parent: str | None = None,
    session: str | None = None,
    rdzv_host: str | None = None,
    startup_s: float = STARTUP_S,
) -> Launched:
    """Start the trainer argv on every host as one torchrun job: one run id, the same
    params and parent on every node. The listing entry of node 0, with every node.

    A node that fails to start has the others stopped (they would wait for it at the
    rendezvous) and raises its RunError."""
    argv = list(argv)
    names = [h.name for h in hosts]
    if len(hosts) < 2 or len(set(names)) != len(names):
        raise RunError(f"a multi-node run needs two or more different hosts, got {', '.join(names) or 'none'}")
    if nproc_per_node < 1:
        raise RunError(f"--nproc-per-node must be at least 1, got {nproc_per_node}")
    commands = {name: (train_commands or {}).get(name) for name in names}
    if train_args_start(argv, commands[names[0]]) is None:
        raise RunError(f"a multi-node run runs the trainer (trackside train …), not {argv[0]}")
    params = run_params.check(params) if params is not None else run_params.read(argv)
    run_id = new_run_id()
    session = session or session_name(run_id)
    dirs = [await run_dir(h, run_id) for h in hosts]
    first = await resolve_program(hosts[0], launch_command(argv, params, dirs[0], commands[names[0]]))
    endpoint = f"{rdzv_host or rendezvous_host(hosts)}:{await _free_port(hosts[0], _python(first))}"
    spans = [{"host": h.name, "session": session, "run_dir": d} for h, d in zip(hosts, dirs)]
    wrap = partial(torchrun_command, nnodes=len(hosts), nproc_per_node=nproc_per_node, endpoint=endpoint, run_id=run_id)
    started = await asyncio.gather(
        *(
            launch(
                h, argv, session=session, params=params, parent=parent, train_command=commands[h.name],
                startup_s=startup_s, run_id=run_id, wrap=partial(wrap, serves=i == 0),
                extra={"nodes": spans, "node": i, "nproc_per_node": nproc_per_node, "rdzv_endpoint": endpoint},
            )
            for i, h in enumerate(hosts)
        ),
        return_exceptions=True,
    )  # fmt: skip
    failed = [r for r in started if isinstance(r, BaseException)]
    if failed:
        for h, r in zip(hosts, started):
            if isinstance(r, RunInfo) and r.state is RunPhase.RUNNING:
                with contextlib.suppress(kill.KillError, HostError):
                    await kill.kill_run(h, r.run_id, grace_s=5.0)
        raise failed[0]
    return dataclasses.replace(started[0], nodes=[NodeInfo(h.name, i, r.session, r.run_dir, r.state.value, r.exit_status, r.pids)
                                                  for i, (h, r) in enumerate(zip(hosts, started))])  # fmt: skip


async def relaunch_nodes(
    hosts: Mapping[str, Host],
    host: Host,
    run_id: str,
    changes: dict,
    *,
    train_commands: Mapping[str, Sequence[str] | None] | None = None,
) -> Launched:
    """A multi-node run (read on `host`, one of its nodes) launched again on the same
    hosts with changed params, its parent named: what the dashboard's `r` calls for a run
    whose listing has `nodes`. Resuming is not offered: the checkpoint lives on the node
    that held rank 0 only, and every rank reads its own run dir's."""
    manifest = await read_manifest(host, run_id)
    spans = manifest.get("nodes") or []
    if len(spans) < 2:
        raise RunError(f"run {run_id} runs on {host.name} only: relaunch it as one run")
    missing = [n["host"] for n in spans if n["host"] not in hosts]
    if missing:
        raise RunError(f"run {run_id} has nodes on {', '.join(missing)}, not hosts of the config")
    argv, params = run_params.edited(manifest["argv"], manifest.get("params", {}), changes)
    # The session name the user gave passes on where every node's session is gone (each
    # node's manifest names its own pane); else the run goes to trackside's name, said.
    kept = [await parent_session_name(hosts[n["host"]], await read_manifest(hosts[n["host"]], run_id)) for n in spans]
    session = kept[0][0] if all(name == kept[0][0] for name, _ in kept) else None
    launched = await launch_nodes(
        [hosts[n["host"]] for n in spans], argv, manifest["nproc_per_node"], train_commands=train_commands,
        params=params, parent=run_id, session=session, rdzv_host=manifest["rdzv_endpoint"].rpartition(":")[0],
    )  # fmt: skip
    notes = [f"on {n['host']}, {note}" for n, (_, note) in zip(spans, kept) if note]
    if notes:
        launched.session_note = f"{'; '.join(notes)}: this run is in tmux session {launched.session}"
    return launched


def merge(infos: Sequence[RunInfo]) -> list[RunInfo]:
    """The listing with each multi-node run's nodes (listed on their hosts) as one entry,
    where its first node was; everything else as it was."""
    parts: dict[str, list[RunInfo]] = {}
    order: list[RunInfo | str] = []
    for info in infos:
        if info.nodes and info.run_id:
            if info.run_id not in parts:
                order.append(info.run_id)
            parts.setdefault(info.run_id, []).append(info)
        else:
            order.append(info)
    return [_combine(parts[item]) if isinstance(item, str) else item for item in order]


def _combine(parts: list[RunInfo]) -> RunInfo:
    """One run from its nodes' entries: rank 0's metrics, session and run dir (the node
    whose run dir has the trainer's start event; node 0 until one has), and each node's
    state as its own host listed it."""
    nodes = [dataclasses.replace(n) for n in parts[0].nodes]
    for part in parts:
        for i, n in enumerate(part.nodes):
            if n.host == part.host and i < len(nodes):
                nodes[i] = dataclasses.replace(n, pids=list(n.pids))
    head = next((p for p in parts if p.steps_per_epoch is not None), None)
    head = head or next((p for p in parts if any(n.node == 0 and n.host == p.host for n in p.nodes)), parts[0])
    states = {n.state for n in nodes}
    failed = next((n.exit_status for n in nodes if n.exit_status and not launcher_code(head.end_status, n.exit_status)), None)
    if RunPhase.RUNNING.value in states:
        state, exit_status = RunPhase.RUNNING, None
    elif RunPhase.OOM.value in states:
        state, exit_status = RunPhase.OOM, failed if failed is not None else head.exit_status
    elif RunPhase.UNKNOWN.value in states:
        state, exit_status = RunPhase.UNKNOWN, failed
    else:
        state, exit_status = RunPhase.EXITED, failed if failed is not None else head.exit_status
    return dataclasses.replace(head, state=state, exit_status=exit_status, nodes=nodes, pids=list(head.pids))


async def list_spanning(host: Host, hosts: Mapping[str, Host], gpu_pids=None) -> list[RunInfo]:
    """The host's listing (`gpu_pids` as list_runs takes it), each multi-node run found
    there merged with its nodes listed on their own hosts (those of `hosts`; a node on a
    host that cannot be listed stays `unknown`)."""
    infos = await list_runs(host, gpu_pids=gpu_pids)
    wanted = {n.host for i in infos for n in i.nodes if n.host != host.name and n.host in hosts}
    spanning = {i.run_id for i in infos if i.nodes}

    async def others(name: str) -> list[RunInfo]:
        try:
            return [i for i in await list_runs(hosts[name]) if i.run_id in spanning and i.nodes]
        except HostError:
            return []

    found = await asyncio.gather(*(others(name) for name in sorted(wanted)))
    return merge([*infos, *(i for listed in found for i in listed)])


def _dead(info: RunInfo) -> list[NodeInfo]:
    """The nodes of a multi-node run that ended other than cleanly."""
    return [
        n for n in info.nodes
        if n.state not in (RunPhase.RUNNING.value, RunPhase.UNKNOWN.value)
        and n.exit_status and not launcher_code(info.end_status, n.exit_status)
    ]  # fmt: skip


def _how(status: int) -> str:
    if status < 0:
        try:
            return f"killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"killed by signal {-status}"
    return f"exit status {status}"


async def stop_orphans(
    infos: Sequence[RunInfo], hosts: Mapping[str, Host], *, grace_s: float = kill.GRACE_S, smis: Mapping[str, str] | None = None
) -> dict[str, kill.KillReport]:
    """Stop the live nodes of every multi-node run (of a merged listing) with a node that
    died: they would wait on it in their next collective. The kill reports, by run id.
    GPU memory is read with the nvidia-smi of the host heading each kill (`smis`)."""
    stopped = {}
    for info in infos:
        alive = [n for n in info.nodes if n.state == RunPhase.RUNNING.value and n.host in hosts]
        if not (_dead(info) and alive):
            continue
        with contextlib.suppress(kill.AlreadyEnded):  # ended on their own meanwhile
            head = hosts[alive[0].host]
            smi = (smis or {}).get(head.name, gpu.DEFAULT_SMI)
            stopped[info.run_id] = await kill.kill_run(head, info.run_id, grace_s=grace_s, smi=smi, hosts=hosts, smis=smis)
    return stopped


async def root_causes(info: RunInfo, hosts: Mapping[str, Host]) -> dict[int, str]:
    """How each dead node's first failed worker ended, by node, as its torchrun summed it
    up in its console ("rank 1 killed by SIGKILL"): torchrun itself exits 1 whatever
    happened to its workers."""
    causes = {}
    for node in _dead(info):
        if node.host in hosts and node.run_dir:
            with contextlib.suppress(HostError):
                tail = await hosts[node.host].run(["tail", "-c", str(CONSOLE_TAIL_BYTES), f"{node.run_dir}/console.log"])
                if found := _ROOT_CAUSE.search(tail.stdout):
                    causes[node.node] = f"rank {found[1]} {_how(int(found[2]))}"
    return causes


def node_alert(info: RunInfo, report: kill.KillReport | None = None, causes: Mapping[int, str] | None = None) -> Alert | None:
    """A multi-node run with a dead node: which, how (its worker's end, from `causes`),
    and which nodes were stopped for it."""
    dead = _dead(info)
    if not dead:
        return None
    causes = causes or {}
    said = "; ".join(
        f"node {n.node} on {n.host} {_how(n.exit_status)}" + (f" ({causes[n.node]})" if n.node in causes else "") for n in dead
    )
    if report is not None:
        hosts = [r.host for r in (report, *report.nodes)]
        said += f"; stopped the node(s) on {', '.join(hosts)} rather than leave them waiting on it"
    return Alert(f"node:{info.run_id}", f"{info.run_id} lost a node: {said}", "error")
