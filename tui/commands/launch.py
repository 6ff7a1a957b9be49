"""`trackside launch` and `trackside relaunch`: their flags, what is checked before
anything starts, and what they print (what was shipped, what was launched where, and how
its start was judged: backends.runs.launch)."""

from __future__ import annotations

import argparse
import re

from backends import nodes, params, ranges, runs, tmux
from backends.config import ConfigError, HostConfig
from backends.hosts import Host
from backends.relaunch import Relaunch, relaunch
from backends.ship.deliver import Delivery, Sent
from training.contract import RUN_ID_EXAMPLE, UsageError
from tui.commands.flags import bounded
from tui.commands.shared import Fleet, Said


def _names(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",")]
    if len(names) < 2 or not all(names):
        raise argparse.ArgumentTypeError(f"expected two or more host names separated by commas, got {text!r}")
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"a host named twice in {text!r}")
    return names


def _address(text: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?", text):
        raise argparse.ArgumentTypeError(f"expected a host name or IPv4 address, got {text!r}")
    return text


def add_parsers(command) -> None:
    """`launch` and `relaunch`, each made by `command(name, help)` with the shared flags."""
    launch = command("launch", "Run a command (given after --) in a new tmux session with a run directory.")
    launch.add_argument("--session", help=f"tmux session name (default {runs.session_name('<run id>')})")
    launch.add_argument("--hosts", type=_names, metavar="H1,H2,…",
                        help="run the trainer on every one of these hosts as one torchrun job (c10d rendezvous on the first)")
    launch.add_argument("--nproc-per-node", type=bounded(ranges.NPROC_PER_NODE), metavar="N", help="with --hosts: processes per host (default 1)")
    launch.add_argument("--rdzv-host", type=_address, metavar="ADDR",
                        help="with --hosts: the address the other hosts reach the first by (default: its configured address)")
    ship_help = ("send the local training package to the host first (to <runs_root>/code/<hash>/, only what changed) "
                 "and run the trainer from it, and the host's [[sync]] directories (default: the host's `ship` setting)")
    launch.add_argument("--ship", action=argparse.BooleanOptionalAction, help=ship_help)
    again = command("relaunch", "Launch a run again with changed parameters.")
    again.add_argument("run", metavar="RUN")
    again.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                       help=f"change a parameter ({', '.join(params.PARAMS)})")  # fmt: skip
    again.add_argument("--resume", action="store_true", help="start from the parent's latest checkpoint")
    again.add_argument("--ship", action=argparse.BooleanOptionalAction,
                       help="send the code here again first, from where the parent's came (else as `launch --ship`); "
                            "without, the child runs the parent's code (default: the host's `ship` setting)")


def split_command(argv: list[str]) -> tuple[list[str], list[str]]:
    """`launch`'s own arguments and the command it runs (after --); with -h or --help
    before any, launch's own arguments alone (its help is printed, nothing runs)."""
    if "--" not in argv and {"-h", "--help"} & set(argv):
        return argv, []
    if "--" not in argv:
        raise Said("trackside launch: give the command after --, e.g. trackside launch -- trackside train --synthetic")
    split = argv.index("--")
    if not argv[split + 1 :]:
        raise Said("trackside launch: the command after -- is empty")
    return argv[:split], argv[split + 1 :]


def check(args: argparse.Namespace) -> None:
    """What `launch` and `relaunch` refuse before reading any host (exit 2)."""
    if args.subcommand == "launch":
        if args.hosts is None:
            given = [flag for flag, value in (("--nproc-per-node", args.nproc_per_node), ("--rdzv-host", args.rdzv_host)) if value]
            if given:
                raise Said(f"trackside launch: {given[0]} goes with --hosts")
        if args.hosts is not None and args.host is not None:
            raise Said("trackside launch: --host and --hosts: give one")
        if args.hosts is not None and args.ship:
            raise Said("trackside launch: --ship is for a run on one host, not --hosts")
        if args.session is not None:
            try:
                tmux.check_session_name(args.session)
            except ValueError as e:
                raise UsageError(f"--session: {e}")
    if args.subcommand == "relaunch":
        if not runs.RUN_ID.fullmatch(args.run):
            raise UsageError(f"RUN: {args.run!r} is not a run id (like {RUN_ID_EXAMPLE})")
        try:
            args.changes = params.parse_sets(args.sets)
        except params.ParamError as e:
            raise UsageError(f"--set {e}")


def _check_nodes(args, fleet: Fleet) -> None:
    """A multi-node launch's usage errors (exit 2): a --hosts name the config lacks, a
    command that is not the trainer, a first host the others cannot reach as configured."""
    config = fleet.config
    for name in args.hosts:
        try:
            config.host(name)
        except ConfigError as e:
            raise Said(f"trackside launch: --hosts: {e.problem}") from None
    if runs.train_args_start(args.command, config.host(args.hosts[0]).train_command) is None:
        raise Said(f"trackside launch: --hosts runs the trainer (-- trackside train …), not {args.command[0]}")
    if args.rdzv_host is None:
        try:
            nodes.rendezvous_host([fleet.hosts[name] for name in args.hosts])
        except runs.RunError as e:
            raise Said(f"trackside launch: --hosts: {e}") from None


async def _delivered(host: Host, delivery: Delivery, trainer: bool) -> Sent:
    """The code sent and put in place before a launch (nothing was stopped for it)."""
    sent = await delivery.send_for(host, trainer=trainer)
    await sent.put_in_place(host)
    return sent


def _ships(args, entry: HostConfig) -> bool:
    return entry.ship if args.ship is None else args.ship


def _launched(info: runs.RunInfo, relaunch: bool, sent: Sent | None = None) -> dict:
    shape = {"run_id": info.run_id, "host": info.host, "session": info.session, "run_dir": info.run_dir}
    if info.nodes:
        shape["nodes"] = [{"host": n.host, "session": n.session, "run_dir": n.run_dir} for n in info.nodes]
    if sent is not None:
        shape["shipped"] = sent.to_json()
    return {**shape, "parent": info.parent} if relaunch else shape


def _show_launched(doc: dict, judged: str, sent: Sent | None = None) -> str:
    parent = f" (from {doc['parent']})" if doc.get("parent") else ""
    shipped = "".join(f"shipped {line}\n" for line in sent.said()) if sent is not None else ""
    if doc.get("nodes"):
        where = "".join(f"\nnode {i} on {n['host']}: tmux session {n['session']}, run dir {n['run_dir']}" for i, n in enumerate(doc["nodes"]))
        return f"launched {doc['run_id']}{parent} on {len(doc['nodes'])} hosts{where}\n{judged}"
    return f"{shipped}launched {doc['run_id']}{parent} on {doc['host']} in tmux session {doc['session']}\nrun dir: {doc['run_dir']}\n{judged}"


async def run_launch(args, fleet: Fleet) -> tuple[dict, str, list[str]]:
    entry = fleet.config.host(args.host) if args.host else fleet.config.hosts[0]
    sent = None
    if args.hosts:
        _check_nodes(args, fleet)
        info = await nodes.launch_nodes(
            [fleet.hosts[name] for name in args.hosts], args.command, args.nproc_per_node or 1, session=args.session,
            train_commands=fleet.train_commands, rdzv_host=args.rdzv_host,
        )  # fmt: skip
    else:
        host = fleet.hosts[entry.name]
        if _ships(args, entry):
            trainer = runs.train_args_start(args.command, entry.train_command) is not None
            sent = await _delivered(host, entry.delivery(), trainer)
        info = await runs.launch(host, args.command, session=args.session, train_command=entry.train_command, sent=sent)
    doc = _launched(info, relaunch=False, sent=sent)
    return doc, _show_launched(doc, info.judged, sent), []


async def run_relaunch(args, fleet: Fleet, name: str) -> tuple[dict, str, list[str]]:
    """`relaunch` of the run on host `name`."""
    entry = fleet.config.host(name)
    ship = entry.delivery() if _ships(args, entry) else None
    asked = Relaunch(name, args.run, args.changes, args.resume, ship=ship, ship_asked=bool(args.ship))
    info, sent = await relaunch(asked, fleet.hosts, fleet.train_commands)
    doc = _launched(info, relaunch=True, sent=sent)
    if info.session_note:
        doc["session_note"] = info.session_note
    return doc, _show_launched(doc, "\n".join(filter(None, [info.judged, doc.get("session_note")])), sent), []
