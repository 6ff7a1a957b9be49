"""Multi-node runs: one trainer run spread over several hosts as one torchrun job.

Every host runs torchrun with c10d rendezvous: the run id as the rendezvous id, the first
host's address as endpoint (its agent serves the rendezvous store), `--nnodes` the number
of hosts. Each node is an ordinary run on its host — its own tmux session and run dir
`<that host's runs_root>/<run id>/` (no shared filesystem is assumed) — whose manifest
also names every node (`nodes`), its own place among them (`node`), `nproc_per_node` and
`rdzv_endpoint`. Only global rank 0 writes metrics.jsonl and checkpoints, so one node's
run dir holds the run's metrics: the node the rendezvous gave rank 0, which c10d picks by
address (it ignores `--node-rank`), not necessarily node 0.

`launch` starts every node (and again, for backends.relaunch, which decides that a run is
relaunched so), `listing` makes one listing entry of a run spanning hosts, `supervise`
stops the nodes left waiting on a dead one (`trackside watch` applies it on every poll; a
listing never stops anything), `alert` says which node died and how. Callers import from
here.
"""

from backends.nodes.alert import node_alert
from backends.nodes.launch import launch_nodes, relaunch_nodes, rendezvous_host, torchrun_command
from backends.nodes.listing import list_spanning, merge
from backends.nodes.supervise import root_causes, stop_orphans

__all__ = [
    "launch_nodes",
    "list_spanning",
    "merge",
    "node_alert",
    "relaunch_nodes",
    "rendezvous_host",
    "root_causes",
    "stop_orphans",
    "torchrun_command",
]
