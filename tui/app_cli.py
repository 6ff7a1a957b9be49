"""`trackside [--config PATH]` and `trackside demo`: build the hosts, open the app."""

from __future__ import annotations

import argparse
import os
import sys
import time

from backends.config import ConfigError, load_config
from backends.hosts import DEFAULT_RUNS_ROOT, LocalHost
from tui.app import Demo, TracksideApp, Watched

DEMO_PARAMS = {"max_seq_len": 256, "ttt_steps": 3, "steps": 20000, "lr": 3e-3}


def demo_argv(params: dict) -> list[str]:
    """The trainer on synthetic data, run by this Python (so the venv's torch is used)."""
    from backends import params as run_params

    return run_params.apply([sys.executable, "-m", "training", "train", "--synthetic"], params)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="trackside",
        description="The dashboard over the configured hosts; `trackside demo` shows it on a small CPU run.",
    )
    parser.add_argument("command", nargs="?", choices=["demo"], help="demo: launch a small CPU run and watch it")
    parser.add_argument("--config", metavar="PATH", help="hosts file (default ~/.config/trackside/config.toml)")
    return parser.parse_args(argv)


def dashboard(config_path: str | None) -> TracksideApp:
    """The app over the config's hosts (without a file: this machine)."""
    config = load_config(config_path)
    hosts = config.make_hosts()
    watched = [Watched(hosts[hc.name], hc.nvidia_smi, hc.train_command) for hc in config.hosts]
    return TracksideApp(
        watched, poll_interval=config.defaults["poll_ms"] / 1000, grace_s=config.defaults["grace_s"]
    )


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.command == "demo":
        demo = Demo(demo_argv(DEMO_PARAMS), f"trackside-demo-{time.strftime('%H%M%S')}", dict(DEMO_PARAMS))
        # The trainer's own variable for where runs go, so a demo can be kept apart.
        runs_root = os.environ.get("TRACKSIDE_RUNS_ROOT", DEFAULT_RUNS_ROOT)
        app = TracksideApp([Watched(LocalHost(runs_root=runs_root))], demo=demo)
    else:
        try:
            app = dashboard(args.config)
        except ConfigError as error:
            print(f"trackside: {error}", file=sys.stderr)
            return 2
    app.run()
    if app.return_code:
        print(f"trackside: the dashboard stopped on an error; traceback in {app.error_log}", file=sys.stderr)
    return app.return_code or 0
