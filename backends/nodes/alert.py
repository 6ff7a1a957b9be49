"""What a multi-node run that lost a node says: which node, how it ended, and which nodes
were stopped for it."""

from __future__ import annotations

import signal
from collections.abc import Mapping

from backends import kill
from backends.alerts import Alert
from backends.nodes.listing import dead_nodes
from backends.runs import RunInfo


def how_ended(status: int) -> str:
    """A node's (or a worker's) end in words: a negative status is the signal that ended it."""
    if status < 0:
        try:
            return f"killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"killed by signal {-status}"
    return f"exit status {status}"


def node_alert(info: RunInfo, report: kill.KillReport | None = None, causes: Mapping[int, str] | None = None) -> Alert | None:
    """A multi-node run with a dead node: which, how (its worker's end, from `causes`),
    and which nodes were stopped for it."""
    dead = dead_nodes(info)
    if not dead:
        return None
    causes = causes or {}
    said = "; ".join(
        f"node {n.node} on {n.host} {how_ended(n.exit_status)}" + (f" ({causes[n.node]})" if n.node in causes else "") for n in dead
    )
    if report is not None:
        hosts = [r.host for r in (report, *report.nodes)]
        said += f"; stopped the node(s) on {', '.join(hosts)} rather than leave them waiting on it"
    return Alert(f"node:{info.run_id}", f"{info.run_id} lost a node: {said}", "error")
