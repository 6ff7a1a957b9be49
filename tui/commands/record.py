"""`trackside record start|status|stop`: the hosts' GPU recorders by hand (any other
command starts one where none runs, unless the host's config says `record = false` or it
was stopped here; a `start` here starts it in either case, and a `stop` holds it stopped). One line a host: its recorder's state and where its
files are (`<runs_root>/gpu/`, backends/recorder/layout.py).

Exit status: 0, 1 when a host could not be reached or refused, 2 for a bad argument or
config (naming the key).
"""

from __future__ import annotations

import asyncio
import sys

from backends import sanitize
from backends.config import ConfigError, load_config
from backends.hosts import Host, HostError
from backends.recorder.layout import GPU_DIR
from backends.recorder.start import recorder
from training.contract import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, OneLineParser, UsageError

SAID = {
    "running": "running",
    "started": "started",
    "stopped": "stopped",
    "absent": "not running",
    "held": "not running: stopped by hand (no command starts it again but `trackside record start`)",
    "no-smi": "not started: the host has no nvidia-smi (config: nvidia_smi)",
    "no-python": "not started: the host has no python3",
}


async def _each(what: str, hosts: dict[str, Host], smis: dict[str, str]) -> list[tuple[str, str | None]]:
    async def one(name: str, host: Host) -> tuple[str, str | None]:
        try:
            state = await recorder(host, what, smis[name])
            root = await host.expanded_runs_root()
            return f"{name}: {SAID.get(state, state)} ({root}/{GPU_DIR}/)", None
        except HostError as error:
            return "", str(error)
        finally:
            await host.close()

    return await asyncio.gather(*(one(name, host) for name, host in hosts.items()))


def main(argv: list[str]) -> int:
    parser = OneLineParser(prog="trackside record", description="Start, check or stop the hosts' GPU recorders.")
    parser.add_argument("action", choices=("start", "status", "stop"))
    parser.add_argument("--config", metavar="PATH", help="config file (default ~/.config/trackside/config.toml)")
    parser.add_argument("--host", action="append", help="a host of the config file (repeatable; default: all)")
    try:
        args = parser.parse_args(argv)
        config = load_config(args.config)
        entries = [config.host(name) for name in args.host] if args.host else config.hosts
    except (UsageError, ConfigError) as error:
        print(f"trackside record: {error}", file=sys.stderr)
        return EXIT_USAGE
    hosts = {entry.name: entry.make_host() for entry in entries}
    for host in hosts.values():
        host.on_reach = None  # this command says what it does itself
    results = asyncio.run(_each(args.action, hosts, {e.name: e.nvidia_smi for e in entries}))
    for line, error in results:
        if error is None:
            print(sanitize.line(line))
        else:
            print(f"trackside record: {sanitize.line(error)}", file=sys.stderr)
    return EXIT_FAILURE if any(error for _, error in results) else EXIT_OK
