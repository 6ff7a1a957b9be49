"""`trackside launch|runs|kill|relaunch`: the dashboard's run keys, headless.

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

from backends import kill, params, runs, tmux
from backends.config import ConfigError, HostConfig, load_config
from backends.hosts import Host, HostError
from backends.logparse import Progress
from training.contract import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, RUN_ID_EXAMPLE


class UsageError(Exception):
    """Bad arguments: exit 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise UsageError(f"{self.prog}: {message}")


def _grace(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}")
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected seconds >= 0, got {text!r}")
    return value


def _parser() -> _Parser:
    parser = _Parser(prog="trackside", description="Start, list, stop and relaunch runs in tmux on a host.")
    commands = parser.add_subparsers(dest="subcommand", required=True)

    def command(name: str, help: str) -> _Parser:
        sub = commands.add_parser(name, help=help, description=help)
        sub.add_argument("--host", help="a host of the config file (default: its first host; without one, this machine)")
        sub.add_argument("--config", metavar="PATH", help="config file (default ~/.config/trackside/config.toml)")
        sub.add_argument("--json", action="store_true", help="print one JSON document")
        return sub

    launch = command("launch", "Run a command (given after --) in a new tmux session with a run directory.")
    launch.add_argument("--session", help="tmux session name (default ts-<run id>)")
    command("runs", "List runs and every other tmux session on the host.")
    stop = command("kill", "Stop a run's own process tree, then verify its GPU memory is released.")
    stop.add_argument("target", metavar="RUN_OR_SESSION")
    stop.add_argument("--grace", type=_grace, help="seconds between SIGTERM and SIGKILL (default from config, 30)")
    stop.epilog = (
        "Exits 1 when the run had already ended (its exit status is named; nothing is stopped or closed), "
        "2 when RUN_OR_SESSION is the tmux session this trackside itself runs in (refused)."
    )
    again = command("relaunch", "Launch a run again with changed parameters.")
    again.add_argument("run", metavar="RUN")
    again.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                       help=f"change a parameter ({', '.join(params.PARAMS)})")  # fmt: skip
    again.add_argument("--resume", action="store_true", help="start from the parent's latest checkpoint")
    return parser


def _parse(argv: list[str]) -> argparse.Namespace:
    command: list[str] = []
    if argv[:1] == ["launch"]:
        if "--" not in argv:
            raise UsageError("trackside launch: give the command after --, e.g. trackside launch -- trackside train --synthetic")
        split = argv.index("--")
        argv, command = argv[:split], argv[split + 1 :]
        if not command:
            raise UsageError("trackside launch: the command after -- is empty")
    args = _parser().parse_args(argv)
    args.command = command
    if getattr(args, "session", None) is not None:
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
    return args


def _host_config(args) -> tuple[HostConfig, dict]:
    config = load_config(args.config)
    return (config.host(args.host) if args.host else config.hosts[0]), config.defaults


def _launched(info: runs.RunInfo, relaunch: bool) -> dict:
    shape = {"run_id": info.run_id, "host": info.host, "session": info.session, "run_dir": info.run_dir}
    return {**shape, "parent": info.parent} if relaunch else shape


def _show_launched(doc: dict) -> str:
    parent = f" (from {doc['parent']})" if doc.get("parent") else ""
    return f"launched {doc['run_id']}{parent} on {doc['host']} in tmux session {doc['session']}\nrun dir: {doc['run_dir']}"


def _show_progress(p: Progress) -> str:
    """`Epoch 2 450/1000, ETA 0:00:36`: a foreign run's bar as its pane shows it."""
    eta = "" if p.eta_s is None else f", ETA {int(p.eta_s) // 3600}:{int(p.eta_s) % 3600 // 60:02d}:{int(p.eta_s) % 60:02d}"
    return f"{p.label or p.phase} {p.done}/{p.total}{eta}"


def _show_runs(infos: list[runs.RunInfo]) -> str:
    if not infos:
        return "no runs and no tmux sessions"
    rows = [("RUN", "SESSION", "STATE", "STEP", "LOSS", "PARAMS", "PIDS")]
    for r in infos:
        if runs.launcher_code(r.end_status, r.exit_status):
            state = f"{r.state.value} ({r.end_status}; launcher exit {r.exit_status})"
        else:
            state = r.state.value + (f" ({r.exit_status})" if r.exit_status is not None else "")
        loss = f"{r.last_loss:.4g}" if isinstance(r.last_loss, (int, float)) else "-"
        step = str(r.last_step if r.last_step is not None else "-") + (f" ({_show_progress(r.progress)})" if r.progress else "")
        rows.append((
            r.run_id or "-", r.session, state, step, loss,
            " ".join(f"{k}={v}" for k, v in r.params.items()) or "-", " ".join(map(str, r.pids)) or "-",
        ))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[-1] for row in rows)


def _show_kill(report: kill.KillReport) -> str:
    lines = [
        f"{report.target}: SIGTERM to {len(report.signalled)} process(es)"
        + (f", SIGKILL to {len(report.killed)} after the grace period" if report.killed else "")
        + (f", exit status {report.exit_status}" if report.exit_status is not None else "")
    ]
    if report.survivors:
        lines.append(f"still alive after SIGKILL: {' '.join(map(str, report.survivors))}")
    lines += [f"GPU {g.index}: {g.before_mib} MiB before, {g.after_mib} MiB after" for g in report.gpus]
    lines += [f"straggler: {kill.holding(p)}" for p in report.stragglers]
    lines += [f"held by a process outside the run: {kill.holding(p)} — not touched" for p in report.other_holders]
    return "\n".join([*lines, report.verdict(), *report.notes])


async def _run(args) -> tuple[object, str]:
    """(JSON document, human text) for the subcommand."""
    entry, defaults = _host_config(args)
    host: Host = entry.make_host()
    try:
        if args.subcommand == "launch":
            info = await runs.launch(host, args.command, session=args.session, train_command=entry.train_command)
            doc = _launched(info, relaunch=False)
            return doc, _show_launched(doc)
        if args.subcommand == "runs":
            infos = await runs.list_runs(host)
            return [r.to_json() for r in infos], _show_runs(infos)
        if args.subcommand == "kill":
            grace = args.grace if args.grace is not None else defaults.get("grace_s", 30.0)
            report = await kill.kill_run(host, args.target, grace_s=grace, smi=entry.nvidia_smi)
            return report.to_json(), _show_kill(report)
        info = await runs.relaunch(host, args.run, args.changes, args.resume, train_command=entry.train_command)
        doc = _launched(info, relaunch=True)
        return doc, _show_launched(doc)
    finally:
        await host.close()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    failures: dict[type, int] = {
        UsageError: EXIT_USAGE, ConfigError: EXIT_USAGE, params.ParamError: EXIT_USAGE, kill.SelfKill: EXIT_USAGE,
        HostError: EXIT_FAILURE, runs.RunError: EXIT_FAILURE, kill.KillError: EXIT_FAILURE,
    }  # fmt: skip
    try:
        args = _parse(argv)
        doc, text = asyncio.run(_run(args))
    except tuple(failures) as e:
        code = next(c for kind, c in failures.items() if isinstance(e, kind))
        print(f"trackside: {e}", file=sys.stderr)
        return code
    print(json.dumps(doc, indent=1) if args.json else text)
    return EXIT_OK
