"""Relaunching a run, whatever it spans: what `trackside relaunch` and the dashboard's
`r`/`R` call, and the one place that decides how a run is relaunched. The run's manifest,
read once (runs.Parent), says whether it is one run on one host (runs.relaunch) or a
multi-node run, relaunched on every node together (nodes.relaunch_nodes: one node alone
would wait for the others forever); each is handed what was read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from backends import nodes, runs
from backends.hosts import Host
from backends.ship.deliver import Delivery, Sent
from training.contract import UsageError


@dataclass(frozen=True)
class Relaunch:
    """What to relaunch and how: the run `run_id` as read on the host named `host`, its
    params edited by `changes`. `resume`: from its latest checkpoint. `ship`: send code
    first, from where the parent's came where it can be taken again from here, else this;
    `ship_asked`: the ship was asked for outright, not a host's default; `sent`: code sent
    already (before a kill), put in place now. `after_pids` (one host's trainer only): the
    run it replaces, still stopping (runs.launch)."""

    host: str
    run_id: str
    changes: Mapping[str, object] = field(default_factory=dict)
    resume: bool = False
    ship: Delivery | None = None
    ship_asked: bool = False
    sent: Sent | None = None
    after_pids: Sequence[int] = ()


async def relaunch(
    request: Relaunch,
    hosts: Mapping[str, Host],
    train_commands: Mapping[str, Sequence[str] | None] | None = None,
    *,
    on_started: Callable[[runs.RunInfo], None] | None = None,
) -> tuple[runs.Launched, Sent | None]:
    """The run `request` names (on one of `hosts`, whose train commands are
    `train_commands`) launched again, and the code sent for it. A multi-node run runs the
    code its hosts have: it refuses `resume`, `sent` and a ship asked for outright with a
    UsageError, before anything is sent or launched. `on_started`: told of a run on one
    host as soon as its session exists (runs.launch)."""
    train_commands = train_commands or {}
    host = hosts[request.host]
    parent = await runs.Parent.read(host, request.run_id)
    if len(parent.nodes) > 1:
        return await nodes.relaunch_nodes(await _nodes(parent, request, hosts), dict(request.changes),
                                          train_commands=train_commands), None  # fmt: skip
    train_command = train_commands.get(host.name)
    sent = request.sent
    if request.ship is not None:
        trainer = runs.train_args_start(parent.manifest["argv"], train_command) is not None
        sent = await (Delivery.of_manifest(parent.manifest) or request.ship).send_for(host, trainer=trainer)
    if sent is not None:
        await sent.put_in_place(host)
    launched = await runs.relaunch(parent, dict(request.changes), request.resume, train_command=train_command, on_started=on_started,
                                   sent=sent, after_pids=request.after_pids)  # fmt: skip
    return launched, sent


async def _nodes(parent: runs.Parent, request: Relaunch, hosts: Mapping[str, Host]) -> list[runs.Parent]:
    """Every node of the multi-node run `parent`, in its order, as its own host's manifest
    says (each names its own session and pane); what a relaunch on one host alone would
    take is refused first."""
    if request.resume:
        raise UsageError("trackside relaunch: --resume: a multi-node run's checkpoint is on one node only")
    if request.ship_asked or request.sent is not None:
        raise UsageError("trackside relaunch: --ship is for a run on one host: this one spans several")
    if request.after_pids:
        raise UsageError("a multi-node run is relaunched once all its nodes have stopped")
    missing = [n["host"] for n in parent.nodes if n["host"] not in hosts]
    if missing:
        raise runs.RunError(f"run {parent.run_id} has nodes on {', '.join(missing)}, not hosts of the config")
    return [
        parent if n["host"] == parent.host.name else await runs.Parent.read(hosts[n["host"]], parent.run_id) for n in parent.nodes
    ]
