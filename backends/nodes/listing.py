"""A multi-node run in a listing: its nodes, each listed on its own host, as one entry
(`merge`, `list_spanning`), and which of them died (`dead_nodes`)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping, Sequence

from backends.hosts import Host, HostError
from backends.runs import NodeInfo, RunInfo, RunPhase, launcher_code, list_runs


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


def dead_nodes(info: RunInfo) -> list[NodeInfo]:
    """The nodes of a multi-node run that ended other than cleanly."""
    return [
        n for n in info.nodes
        if n.state not in (RunPhase.RUNNING.value, RunPhase.UNKNOWN.value)
        and n.exit_status and not launcher_code(info.end_status, n.exit_status)
    ]  # fmt: skip
