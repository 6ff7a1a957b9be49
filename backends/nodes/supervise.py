"""The rule for a multi-node run with a dead node while the others still run: the others
would wait on it in a collective (NCCL's wait is long), so they are stopped; and how the
dead one's workers ended, from its torchrun's summary."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping, Sequence

from backends import gpu, kill
from backends.hosts import Host, HostError
from backends.nodes.alert import how_ended
from backends.nodes.listing import dead_nodes
from backends.runs import RunInfo, RunPhase

# torchrun's summary of a failed job: the first failed worker's rank and exit code.
_ROOT_CAUSE = re.compile(r"Root Cause.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.DOTALL)
CONSOLE_TAIL_BYTES = 65536


async def stop_orphans(
    infos: Sequence[RunInfo], hosts: Mapping[str, Host], *, grace_s: float = kill.GRACE_S, smis: Mapping[str, str] | None = None
) -> dict[str, kill.KillReport]:
    """Stop the live nodes of every multi-node run (of a merged listing) with a node that
    died: they would wait on it in their next collective. The kill reports, by run id.
    GPU memory is read with the nvidia-smi of the host heading each kill (`smis`)."""
    stopped = {}
    for info in infos:
        alive = [n for n in info.nodes if n.state == RunPhase.RUNNING.value and n.host in hosts]
        if not (dead_nodes(info) and alive):
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
    for node in dead_nodes(info):
        if node.host in hosts and node.run_dir:
            with contextlib.suppress(HostError):
                tail = await hosts[node.host].run(["tail", "-c", str(CONSOLE_TAIL_BYTES), f"{node.run_dir}/console.log"])
                if found := _ROOT_CAUSE.search(tail.stdout):
                    causes[node.node] = f"rank {found[1]} {how_ended(int(found[2]))}"
    return causes
