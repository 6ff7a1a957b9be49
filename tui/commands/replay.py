"""`trackside replay RUN [--at TIME]`: the run screen as it was at a moment, with keys to
step through time and to jump to the moments that matter. RUN is a run id, or the tmux
session of a run trackside did not launch (read from its pane's recording, though the
session is gone). Its past is read once, through backends/history; then the app only
draws it.

Exit status: 0, 2 a bad argument (a --at outside the run's life names its start and end),
1 a run or host that cannot be reached or found; a one-line message, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from backends import runs, sanitize, tmux
from backends.config import ConfigError, load_config
from backends.history import History, moments_of, parse_when
from backends.history.read import read_history
from backends.hosts import HostError
from training.contract import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, RUN_ID_EXAMPLE, STEP, UsageError
from tui.commands.shared import Parser

AT_HELP = """TIME, the moment shown first (default: the run's end, or now while it runs):
  +DURATION           after the run's start: +30m, +1h30m, +90s, +2d
  -DURATION           before its end (its last record; now for a run still going)
  HH:MM[:SS]          that time of day on this machine's clock, within the run's life
  YYYY-MM-DD HH:MM[:SS]   local; with a T between and a Z after, UTC
  start, end
"""

KEYS_HELP = """keys: ←/→ a minute (shift: ten), ,/. a step of the curve, p/n the moment that
mattered before/after, m all of them (the alerts that would have fired, OOM, stalls,
skipped steps, stops, relaunches, the recorder's gaps, the exit), Home/End the run's start
and end, y/s/x the chart's axes as on the run screen, q quits.
Read-only: no key acts on the run, and it starts no recorder."""


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = Parser(prog="trackside replay", description="The run screen as it was at a moment: the loss up to then, the GPUs "
                    "then (from the host's recording), the log then.", epilog=AT_HELP + "\n" + KEYS_HELP,
                    formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("run", metavar="RUN", help="a run id, or the tmux session of a run trackside did not launch")
    parser.add_argument("--at", metavar="TIME", help="the moment shown first (below)")
    parser.add_argument("--host", help="a host of the config file (default: its first host; without one, this machine)")
    parser.add_argument("--config", metavar="PATH", help="config file (default ~/.config/trackside/config.toml)")
    # `--at -2h`: argparse takes a value that starts with '-' for a flag of its own.
    argv = [f"--at={argv[i + 1]}" if a == "--at" and i + 1 < len(argv) and argv[i + 1][:1] == "-" else a
            for i, a in enumerate(argv) if not (i and argv[i - 1] == "--at" and a[:1] == "-")]  # fmt: skip
    args = parser.parse_args(argv)
    if not runs.RUN_ID.fullmatch(args.run) and not tmux.is_session_name(args.run):
        raise UsageError(f"trackside replay: RUN {args.run!r} is neither a run id (like {RUN_ID_EXAMPLE}) nor a tmux session name")
    return args


async def read(args) -> tuple[History, object]:
    config = load_config(args.config)
    host = (config.host(args.host) if args.host else config.hosts[0]).make_host()
    host.on_reach = None  # replay only reads: it starts no recorder (a recording brought back is not appended to)
    # A long run's past over SSH takes seconds to read, and its moments seconds to find:
    # said, so that a screen with nothing on it yet is not taken for a hang.
    print(sanitize.block(f"trackside replay: reading {args.run} on {host.name}…"), file=sys.stderr, flush=True)
    try:
        return await read_history(host, args.run), config.alert_rules
    finally:
        await host.close()


def main(argv: list[str]) -> int:
    failures: dict[type, int] = {UsageError: EXIT_USAGE, ConfigError: EXIT_USAGE, HostError: EXIT_FAILURE, runs.RunError: EXIT_FAILURE}
    try:
        args = parse_args(argv)
        history, rules = asyncio.run(read(args))
        when = parse_when(args.at, history.start, history.end) if args.at else history.end
    except tuple(failures) as e:
        code = next(c for kind, c in failures.items() if isinstance(e, kind))
        said = str(e)
        print(sanitize.block(said if said.startswith("trackside replay") else f"trackside replay: {said}"), file=sys.stderr)
        return code
    from tui.replay import ReplayApp  # textual only once there is something to show

    steps = sum(event.get("event") == STEP for event in history.events)
    print(f"trackside replay: finding the moments that mattered in {steps:,} steps…", file=sys.stderr, flush=True)
    app = ReplayApp(history, moments_of(history, rules), when)
    app.run()
    if app.return_code:
        print(f"trackside replay: stopped on an error; traceback in {app.error_log}", file=sys.stderr)
    return app.return_code or EXIT_OK
