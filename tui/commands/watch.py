"""`trackside watch`: the dashboard's alerts as lines on stdout, and the config's
[alerts] command run on each (backends.watch polls and decides).

Exit status: 0, or with `--once` 1 when any alert is up; 2 for a bad argument or config
(naming the key).
"""

from __future__ import annotations

import asyncio
import sys

from backends import alerts, ranges, sanitize
from backends.config import ConfigError, load_config
from backends.watch import INTERVAL_S, Watched, watch
from training.contract import EXIT_OK, EXIT_USAGE, OneLineParser, UsageError
from tui.commands.flags import bounded


def main(argv: list[str]) -> int:
    parser = OneLineParser(
        prog="trackside watch",
        description="Print the dashboard's alerts as lines, and run the config's [alerts] command on each.",
    )
    parser.add_argument("--config", metavar="PATH", help="config file (default ~/.config/trackside/config.toml)")
    parser.add_argument("--host", action="append", help="a host of the config file (repeatable; default: all)")
    parser.add_argument("--once", action="store_true", help="poll once, print what is up, exit 1 if anything is")
    parser.add_argument("--interval", type=bounded(ranges.WATCH_INTERVAL), default=INTERVAL_S, metavar="S",
                        help=f"seconds between polls (default {INTERVAL_S:g})")  # fmt: skip
    try:
        args = parser.parse_args(argv)
        config = load_config(args.config)
        entries = [config.host(name) for name in args.host] if args.host else config.hosts
    except (UsageError, ConfigError) as error:
        print(f"trackside watch: {error}", file=sys.stderr)
        return EXIT_USAGE
    made = config.make_hosts()
    hosts = [Watched(made[entry.name], entry.nvidia_smi) for entry in entries]
    book = alerts.AlertBook(rules=config.alert_rules)
    settings = config.alerts
    try:
        return asyncio.run(
            watch(hosts, book, command=settings["command"], timeout_s=settings["timeout_s"],
                  interval_s=args.interval, grace_s=config.defaults.grace_s, once=args.once,
                  say=lambda line: print(sanitize.line(line), flush=True))
        )  # fmt: skip
    except KeyboardInterrupt:
        return EXIT_OK
