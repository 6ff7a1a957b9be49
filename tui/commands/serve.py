"""`trackside serve`: its flags, the checks before the server starts (a port, a config
that loads, a token), and what it prints; the server itself is tui/serve/.

Every request needs the token, on loopback too: a loopback port is open to every user of
the machine, and the dashboard kills and relaunches runs as whoever started it. Without
--token (or $TRACKSIDE_SERVE_TOKEN) one is made and printed; --no-token is the operator's
explicit choice, on loopback only, and is warned about.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import secrets
import shlex
import sys

from backends import ranges
from tui.commands.flags import bounded
from tui.serve import addresses
from training.contract import EXIT_USAGE, OneLineParser, UsageError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
DEFAULT_MAX_VIEWERS = 5  # docs/serve.md: what 1, 5 and 20 viewers cost one host
TOKEN_ENV = "TRACKSIDE_SERVE_TOKEN"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = OneLineParser(
        prog="trackside serve",
        description="The dashboard in a browser page (one dashboard process per open page).",
        epilog="From another machine: ssh -L 8765:127.0.0.1:8765 HOST, then open http://127.0.0.1:8765/",
    )
    parser.add_argument("--host", default=DEFAULT_HOST, help="address to listen on (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=bounded(ranges.PORT), default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    parser.add_argument("--config", metavar="PATH", help="hosts file (default ~/.config/trackside/config.toml)")
    parser.add_argument(
        "--token", help=f"every request must present it (?token=, then a cookie); also ${TOKEN_ENV}. "
        "Generated and printed when not given",
    )  # fmt: skip
    parser.add_argument(
        "--no-token", action="store_true",
        help="on loopback only: no token, so every user of this machine can drive the dashboard (warned)",
    )  # fmt: skip
    parser.add_argument("--read-only", action="store_true", help="no kill, edit, relaunch or attach")
    parser.add_argument(
        "--max-viewers", type=bounded(ranges.MAX_VIEWERS), default=DEFAULT_MAX_VIEWERS, metavar="N",
        help=f"open pages at once (default {DEFAULT_MAX_VIEWERS}); each one polls every host itself",
    )  # fmt: skip
    return parser.parse_args(argv)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it may resolve to any address


def app_command(config: str | None, read_only: bool) -> str:
    """What each browser connection runs: this Python's dashboard (tui/commands/served.py),
    under textual-serve's web driver. `exec`, so the dashboard is the server's own child
    (no shell between), which it does not outlive."""
    argv = [sys.executable, "-m", "tui.commands.served"]
    if config:
        argv += ["--config", os.path.abspath(os.path.expanduser(config))]
    if read_only:
        argv.append("--read-only")
    return "exec " + shlex.join(argv)


def fail(message: str, status: int) -> int:
    print(f"trackside serve: {message}", file=sys.stderr)
    return status


def main(argv: list[str]) -> int:
    try:
        args = parse_args(argv)
    except UsageError as error:
        return fail(str(error), EXIT_USAGE)
    token = args.token or os.environ.get(TOKEN_ENV) or None
    loopback = is_loopback(args.host)
    if args.no_token and token is not None:
        return fail(f"--no-token with a token (--token or ${TOKEN_ENV}): choose one", 2)
    if args.no_token and not loopback:
        return fail(f"--no-token: only on loopback (--host {args.host} is reached from other machines)", 2)
    try:
        from tui.serve import server
    except ImportError as error:
        return fail(f"needs textual-serve ({error}); install it with: pip install 'trackside[serve]'", 1)

    from backends.config import ConfigError, load_config

    try:
        load_config(args.config)  # each viewer's process reads it again: fail here, once, not in the page
    except ConfigError as error:
        return fail(str(error), 2)

    generated = False
    if token is None and not args.no_token:
        token, generated = secrets.token_urlsafe(24), True

    # A dashboard process that finds $TMUX would take `a` (attach) as switching the tmux
    # client of whoever started the server; a browser viewer is not that client. Its own
    # session is still recognised: its process tree holds this server (backends/own_session).
    for name in ("TMUX", "TMUX_PANE"):
        os.environ.pop(name, None)

    settings = server.Settings(
        command=app_command(args.config, args.read_only),
        host=args.host,
        port=args.port,
        token=token,
        loopback=loopback,
        max_viewers=args.max_viewers,
        read_only=args.read_only,
    )
    # On a wildcard, every address of this machine: 0.0.0.0 is no URL to open.
    urls = [f"http://{host}:{args.port}/" for host in addresses.url_hosts(args.host)]
    where = urls[0] if len(urls) == 1 else f"port {args.port} of every address of this machine"

    def started() -> None:
        print(f"trackside serve: the dashboard on {where}{' (read-only)' if args.read_only else ''}, "
              f"up to {args.max_viewers} viewers; Ctrl+C stops it", flush=True)  # fmt: skip
        if generated:
            print(f"trackside serve: token (shown only now): {token}", flush=True)
        elif not token:
            print("trackside serve: warning: --no-token: every user of this machine can drive this dashboard, "
                  "and stop or relaunch your runs with it", file=sys.stderr, flush=True)  # fmt: skip
        for url in urls:
            print(f"  open {url}" + (f"?token={token}" if generated else "?token=<your token>" if token else ""), flush=True)
        if loopback:
            print(f"  from another machine: ssh -L {args.port}:127.0.0.1:{args.port} <this host>, "
                  f"then http://127.0.0.1:{args.port}/", flush=True)  # fmt: skip

    try:
        return server.serve(settings, started)
    except server.ServeError as error:
        return fail(str(error), 1)
