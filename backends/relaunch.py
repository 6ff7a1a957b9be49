"""Relaunching a run, whatever it spans: what `trackside relaunch` and the dashboard's
`r`/`R` call. The run's manifest says whether it is one run on one host
(backends.runs.relaunch) or a multi-node run, relaunched on every node together
(backends.nodes.relaunch_nodes: one node alone would wait for the others forever).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from backends import nodes, runs
from backends.hosts import Host
from backends.ship.deliver import Delivery, Sent
from training.contract import UsageError


async def relaunch(
    hosts: Mapping[str, Host],
    host: Host,
    run_id: str,
    changes: dict,
    resume: bool = False,
    *,
    train_commands: Mapping[str, Sequence[str] | None] | None = None,
    ship: Delivery | None = None,
    ship_asked: bool = False,
    sent: Sent | None = None,
    on_started: Callable[[runs.RunInfo], None] | None = None,
    after_pids: Sequence[int] = (),
) -> tuple[runs.Launched, Sent | None]:
    """The run `run_id` (read on `host`, one of `hosts`) launched again with `changes`,
    and the code sent for it. `ship`: send code first, from where the parent's came where
    it can be taken again from here, else this; `sent`: code sent already (before a kill),
    put in place now. A multi-node run runs the code its hosts have: it refuses `resume`,
    `sent` and a ship asked for outright (`ship_asked`, not a host's default) with a
    UsageError, before anything is sent or launched. `after_pids` (one host's trainer
    only): the run it replaces, still stopping (runs.launch)."""
    train_commands = train_commands or {}
    manifest = await runs.read_manifest(host, run_id)
    if len(manifest.get("nodes") or []) > 1:
        if resume:
            raise UsageError("trackside relaunch: --resume: a multi-node run's checkpoint is on one node only")
        if ship_asked or sent is not None:
            raise UsageError("trackside relaunch: --ship is for a run on one host: this one spans several")
        if after_pids:
            raise UsageError("a multi-node run is relaunched once all its nodes have stopped")
        return await nodes.relaunch_nodes(hosts, host, run_id, changes, train_commands=train_commands), None
    train_command = train_commands.get(host.name)
    if ship is not None:
        trainer = runs.train_args_start(manifest["argv"], train_command) is not None
        sent = await (Delivery.of_manifest(manifest) or ship).send_for(host, trainer=trainer)
    if sent is not None:
        await sent.put_in_place(host)
    launched = await runs.relaunch(host, run_id, changes, resume, train_command=train_command, on_started=on_started, sent=sent,
                                   after_pids=after_pids)  # fmt: skip
    return launched, sent
