"""Launching a multi-node run: the trainer on every host as one torchrun job (c10d
rendezvous on the first host), and launching one again on the same hosts."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import posixpath
from collections.abc import Mapping, Sequence
from functools import partial

from backends import kill
from backends import params as run_params
from backends.hosts import Host, HostError
from backends.runs import (
    STARTUP_S,
    Launched,
    NodeInfo,
    Parent,
    RunError,
    RunInfo,
    RunPhase,
    launch,
    launch_command,
    parent_session_name,
    resolve_program,
    run_dir,
    session_name,
    train_args_start,
)
from training.contract import new_run_id

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
    nodes: Sequence[Parent], changes: dict, *, train_commands: Mapping[str, Sequence[str] | None] | None = None
) -> Launched:
    """A multi-node run launched again on the same hosts with changed params, its parent
    named: `nodes`, each node's manifest as read on its host by backends.relaunch, which
    decided the run is relaunched so. Resuming is not offered: the checkpoint lives on the
    node that held rank 0 only, and every rank reads its own run dir's."""
    manifest, run_id = nodes[0].manifest, nodes[0].run_id
    argv, params = run_params.edited(manifest["argv"], manifest.get("params", {}), changes)
    # The session name the user gave passes on where every node's session is gone (each
    # node's manifest names its own pane); else the run goes to trackside's name, said.
    kept = [await parent_session_name(node.host, node.manifest) for node in nodes]
    session = kept[0][0] if all(name == kept[0][0] for name, _ in kept) else None
    launched = await launch_nodes(
        [node.host for node in nodes], argv, manifest["nproc_per_node"], train_commands=train_commands,
        params=params, parent=run_id, session=session, rdzv_host=manifest["rdzv_endpoint"].rpartition(":")[0],
    )  # fmt: skip
    notes = [f"on {node.host.name}, {note}" for node, (_, note) in zip(nodes, kept) if note]
    if notes:
        launched.session_note = f"{'; '.join(notes)}: this run is in tmux session {launched.session}"
    return launched
