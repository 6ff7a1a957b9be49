"""`trackside launch|runs|gpus|kill|relaunch`: the dashboard's run keys, headless. Each
subcommand's flags and output are its module's (`launch` for launch and relaunch, `runs`,
`gpus`, `kill`); here, the flags they share, which hosts they read, and how they end.

Exit status: 0 done, 2 a bad argument or value (the message names the flag or key) or a
refused target (`kill` of the session this trackside runs in), 1 anything else (an
unreachable host, a missing run, a run that had already ended, tmux refusing), with a
one-line message and no traceback. `--json` prints one JSON document on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from backends import kill, params, runs, sanitize, tmux
from backends.config import ConfigError, load_config
from backends.hosts import HostError
from backends.reach import holder
from backends.ship import ShipError
from training.contract import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    RUN_ID_EXAMPLE,
    UsageError,
)
from tui.commands import gpus, launch
from tui.commands import kill as kill_command
from tui.commands import runs as runs_command
from tui.commands.shared import Fleet, Parser, Said

COMMANDS = {"launch", "runs", "gpus", "kill", "relaunch"}


def _parser() -> Parser:
    parser = Parser(prog="trackside", description="Start, list, stop and relaunch runs in tmux on a host; read its GPUs.")
    commands = parser.add_subparsers(dest="subcommand", required=True)

    def command(name: str, help: str) -> Parser:
        sub = commands.add_parser(name, help=help, description=help)
        sub.add_argument("--host", help="a host of the config file (default: its first host; without one, this machine)")
        sub.add_argument("--config", metavar="PATH", help="config file (default ~/.config/trackside/config.toml)")
        sub.add_argument("--json", action="store_true", help="print one JSON document")
        return sub

    launch.add_parsers(command)
    runs_command.add_parser(command)
    gpus.add_parser(command)
    kill_command.add_parser(command)
    return parser


def _parse(argv: list[str]) -> argparse.Namespace:
    command: list[str] = []
    if argv[:1] == ["launch"]:
        argv, command = launch.split_command(argv)
    args = _parser().parse_args(argv)
    args.command = command
    launch.check(args)
    return args


async def _run(args) -> tuple[object, str, list[str]]:
    """(JSON document, human text, a line per host that could not be read) for the
    subcommand. Without --host, `runs` and `gpus` read every configured host, `kill` and
    `relaunch` act on whichever host holds the run."""
    config = load_config(args.config)
    if args.host:
        config.host(args.host)  # an unknown name is a usage error
    fleet = Fleet(config, config.make_hosts(), [args.host] if args.host else [e.name for e in config.hosts])
    try:
        if args.subcommand == "launch":
            return await launch.run_launch(args, fleet)
        if args.subcommand == "runs":
            return await runs_command.run(args, fleet)
        if args.subcommand == "gpus":
            return await gpus.run(args, fleet)
        target = args.target if args.subcommand == "kill" else args.run
        if not (runs.RUN_ID.fullmatch(target) or tmux.is_session_name(target)):
            what = "a run id or a tmux session name" if args.subcommand == "kill" else "a run id"
            raise Said(f"trackside {args.subcommand}: {target!r} is not {what} (like {RUN_ID_EXAMPLE})")
        name = args.host or await holder(target, fleet.names, fleet.hosts)
        if args.subcommand == "kill":
            return await kill_command.run(args, fleet, name)
        return await launch.run_relaunch(args, fleet, name)
    finally:
        await asyncio.gather(*(h.close() for h in fleet.hosts.values()))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    failures: dict[type, int] = {
        UsageError: EXIT_USAGE, ConfigError: EXIT_USAGE, params.ParamError: EXIT_USAGE, kill.SelfKill: EXIT_USAGE,
        HostError: EXIT_FAILURE, runs.RunError: EXIT_FAILURE, kill.KillError: EXIT_FAILURE, ShipError: EXIT_FAILURE,
    }  # fmt: skip
    try:
        args = _parse(argv)
        doc, text, unread = asyncio.run(_run(args))
    except tuple(failures) as e:
        code = next(c for kind, c in failures.items() if isinstance(e, kind))
        print(sanitize.block(str(e) if isinstance(e, Said) else f"trackside: {e}"), file=sys.stderr)
        return code
    # What every subcommand prints passes here, cleaned: names, panes' text, process names
    # and hosts' errors are anyone's (backends.sanitize).
    for line in unread:  # a host that could not be read, while others were
        print(f"trackside: {sanitize.line(line)}", file=sys.stderr)
    print(json.dumps(sanitize.value(doc), indent=1) if args.json else sanitize.block(text))
    return EXIT_OK
