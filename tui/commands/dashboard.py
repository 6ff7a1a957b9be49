"""`trackside [--config PATH] [--read-only]` and `trackside demo`: build the hosts, open the
app, and after it, say how it ended (a demo run stopped or left going)."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from backends import kill, runs
from backends.config import ConfigError, load_config
from backends.hosts import LocalHost
from backends.own_session import mark_own_pane
from backends.runs import RunInfo, RunPhase
from training.contract import EXIT_FAILURE, EXIT_USAGE, OneLineParser, UsageError, local_runs_root
from tui.app import Demo, TracksideApp, Watched

DEMO_PARAMS = {"max_seq_len": 256, "ttt_steps": 3, "steps": 20000, "lr": 3e-3}
DEMO_GRACE_S = 10.0  # the CPU trainer checkpoints and exits within a second of SIGTERM


def demo_argv(params: dict) -> list[str]:
    """The trainer on synthetic data, run by this Python (so the venv's torch is used)."""
    from backends import params as run_params

    return run_params.apply([sys.executable, "-m", "training", "train", "--synthetic"], params)


def parse_args(argv: list[str]) -> argparse.Namespace:
    from tui.commands import SUMMARIES

    parser = OneLineParser(
        prog="trackside",
        description="The dashboard over the configured hosts; `trackside demo` shows it on a small CPU run.",
        epilog="commands (trackside COMMAND --help for each one's flags):\n"
        + "\n".join(f"  {name:<9} {line}" for name, line in SUMMARIES.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("command", nargs="?", choices=["demo"], help="demo: launch a small CPU run and watch it")
    parser.add_argument("--config", metavar="PATH", help="hosts file (default ~/.config/trackside/config.toml)")
    parser.add_argument("--keep-run", action="store_true", help="demo: leave its training run and its relaunches going on quit")
    parser.add_argument(
        "--read-only", action="store_true", help="no kill, edit, relaunch or attach (what `trackside serve --read-only` runs)"
    )
    return parser.parse_args(argv)


def dashboard(config_path: str | None, *, read_only: bool = False) -> TracksideApp:
    """The app over the config's hosts (without a file: this machine)."""
    config = load_config(config_path)
    hosts = config.make_hosts()
    watched = [Watched(hosts[hc.name], hc.nvidia_smi, hc.train_command, hc.delivery() if hc.ship else None, hc.record)
               for hc in config.hosts]
    return TracksideApp(
        watched, poll_interval=config.defaults.poll_ms / 1000, grace_s=config.defaults.grace_s,
        alert_rules=config.alert_rules, alert_command=config.alerts["command"], alert_timeout_s=config.alerts["timeout_s"],
        read_only=read_only,
    )  # fmt: skip


def main(argv: list[str]) -> int:
    try:
        args = parse_args(argv)
    except UsageError as error:
        print(f"trackside: {error}", file=sys.stderr)
        return EXIT_USAGE
    if args.command == "demo":
        demo = Demo(demo_argv(DEMO_PARAMS), f"trackside-demo-{time.strftime('%H%M%S')}", dict(DEMO_PARAMS))
        app = TracksideApp([Watched(LocalHost(runs_root=local_runs_root()))], demo=demo, read_only=args.read_only)
    else:
        try:
            app = dashboard(args.config, read_only=args.read_only)
        except ConfigError as error:
            print(f"trackside: {error}", file=sys.stderr)
            return EXIT_USAGE
    mark_own_pane()
    app.run()
    if app.return_code:
        print(f"trackside: the dashboard stopped on an error; traceback in {app.error_log}", file=sys.stderr)
    ended = 0
    if app.demo_run is not None:
        ended = end_demo_run(app.watched[app.demo_run.host].host, app.demo_run, keep=args.keep_run)
    return app.return_code or ended


async def demo_lineage(host: LocalHost, demo: RunInfo) -> list[RunInfo]:
    """The demo's run and every run relaunched from it, at any remove (each manifest names
    its parent), oldest first: `e` and `R` in the demo leave the demo's CPU training to a
    relaunch."""
    listed = sorted((info for info in await runs.list_runs(host) if info.run_id), key=lambda info: info.started or "")
    ids, grown = {demo.run_id}, True
    while grown:  # to a fixed point: run ids of one minute do not sort by age
        before = len(ids)
        ids |= {info.run_id for info in listed if info.parent in ids}
        grown = len(ids) > before
    lineage = [info for info in listed if info.run_id in ids]
    return lineage if any(info.run_id == demo.run_id for info in lineage) else [demo, *lineage]


def end_demo_run(host: LocalHost, demo: RunInfo, *, keep: bool) -> int:
    """The demo's CPU runs would train on (a core each, every demo another): stop the
    demo's run and its relaunches, and say so either way. 130 (as a shell says SIGINT)
    where Ctrl-C cut the stop short."""
    try:
        lineage = asyncio.run(demo_lineage(host, demo))
    except KeyboardInterrupt:
        lineage = [demo]
    except Exception as error:  # unlisted: the demo's own run is still known
        print(f"could not list the demo run's relaunches ({error}): stop any with trackside kill RUN", file=sys.stderr)
        lineage = [demo]
    live = [run for run in lineage if run.run_id == demo.run_id or run.state is RunPhase.RUNNING]
    if keep:
        for run in (run for run in lineage if run.state is RunPhase.RUNNING):
            print(f"{_named(run, demo)} goes on in tmux session {run.session}; stop it with: trackside kill {run.run_id}")
        return 0
    for done, run in enumerate(live):
        print(f"stopping {_named(run, demo)} (tmux session {run.session})…", flush=True)
        try:
            report = asyncio.run(kill.kill_run(host, run.run_id, grace_s=DEMO_GRACE_S))
        except kill.AlreadyEnded:
            print("it had already ended")
            continue
        except KeyboardInterrupt:  # Ctrl-C while it stops: what may be left, never a traceback
            left = "; ".join(f"trackside kill {r.run_id}" for r in live[done:])
            print(f"\ninterrupted: the demo's runs may still be running; stop them with: {left}"
                  if len(live) - done > 1 else
                  f"\ninterrupted: the demo run may still be running; stop it with: trackside kill {run.run_id}",
                  file=sys.stderr)  # fmt: skip
            return 130
        except Exception as error:  # the user is leaving: a message, never a traceback
            print(f"could not stop it ({error}); stop it with: trackside kill {run.run_id}", file=sys.stderr)
            return EXIT_FAILURE
        print(f"stopped in {report.seconds:.1f}s; its run dir stays: {run.run_dir}")
    return 0


def _named(run: RunInfo, demo: RunInfo) -> str:
    return f"the demo run {run.run_id}" if run.run_id == demo.run_id else f"its relaunch {run.run_id} (from {run.parent})"
