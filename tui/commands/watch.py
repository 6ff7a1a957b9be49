"""`trackside watch`: the dashboard's alerts as lines on stdout, and the config's
[alerts] command run on each (backends.watch polls and decides). With `--since 8h`, the
alerts that would have fired in the last 8 hours instead, each at its moment, computed from
the hosts' GPU recordings, run dirs and pane recordings (backends/history/missed.py); no
command is run for them.

Exit status: 0, or with `--once` 1 when any alert is up, with `--since` 1 when any would
have fired; 2 for a bad argument or config (naming the key).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import time

from backends import alerts, ranges, sanitize
from backends.config import ConfigError, load_config
from backends.hosts import Host, HostError
from backends.history.missed import missed
from backends.watch import INTERVAL_S, Watched, alert_line, watch
from training.contract import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, OneLineParser, UsageError
from tui.commands.flags import bounded

_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def duration(text: str) -> float:
    """`8h`, `30m`, `2d`, `90s` or `90` (seconds), within ranges.WATCH_SINCE."""
    m = re.fullmatch(r"(\d{1,9}(?:\.\d{1,6})?)([smhd]?)", text.strip())
    if m is None:
        raise argparse.ArgumentTypeError(f"expected a duration like 8h, 30m, 2d or 90s, got {text!r}")
    return bounded(ranges.WATCH_SINCE)(str(float(m[1]) * _UNITS[m[2]]))


async def _missed(hosts: list[Host], since: float, rules: alerts.Rules) -> tuple[list[tuple[float, str, alerts.Alert]], list[str], list[str]]:
    """Every host's missed alerts in time order, a line for each host that could not be
    read, and the hosts whose GPUs were not recorded over the span."""
    found = await asyncio.gather(*(missed(host, since, time.time(), rules) for host in hosts), return_exceptions=True)
    await asyncio.gather(*(host.close() for host in hosts))
    lines, lost, unrecorded = [], [], []
    for host, result in zip(hosts, found):
        if isinstance(result, HostError):
            lost.append(str(result))
        elif isinstance(result, BaseException):
            raise result
        else:
            lines += result[0]
            unrecorded += [] if result[1] else [host.name]
    return sorted(lines, key=lambda said: said[0]), lost, unrecorded


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
    parser.add_argument("--since", type=duration, metavar="DURATION",
                        help="the alerts that would have fired over the last DURATION (8h, 30m, 2d), from the recordings")  # fmt: skip
    try:
        args = parser.parse_args(argv)
        config = load_config(args.config)
        entries = [config.host(name) for name in args.host] if args.host else config.hosts
    except (UsageError, ConfigError) as error:
        print(f"trackside watch: {error}", file=sys.stderr)
        return EXIT_USAGE
    made = config.make_hosts()
    if args.since is not None:
        since = time.time() - args.since
        said, lost, unrecorded = asyncio.run(_missed([made[entry.name] for entry in entries], since, config.alert_rules))
        for line in [*lost, *(f"{name}: no GPU recording over the span: its under-fed GPUs not checked" for name in unrecorded)]:
            print(f"trackside watch: {sanitize.line(line)}", file=sys.stderr)
        for when, word, alert in said:
            print(sanitize.line(alert_line(when, alert.severity if word == "raised" else word, alert)), flush=True)
        if not said and len(lost) < len(entries):  # silence alone reads as a command that did nothing
            began = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since))
            read = "the hosts read" if lost else ", ".join(sanitize.line(entry.name) for entry in entries)
            print(f"trackside watch: no alert would have fired since {began} on {read}", file=sys.stderr)
        return EXIT_FAILURE if any(word == "raised" for _, word, _ in said) or (lost and len(lost) == len(entries)) else EXIT_OK
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
