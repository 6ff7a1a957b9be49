"""`trackside launch|runs|kill|relaunch`: the dashboard's run keys, headless.

Exit status: 0 done, 2 a bad argument or value (the message names the flag or key) or a
refused target (`kill` of the session this trackside runs in), 1 anything else (an
unreachable host, a missing run, a run that had already ended, tmux refusing), with a
one-line message and no traceback. `--json` prints one JSON document on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import re
import sys

from backends import gpu, kill, nodes, params, runs, tmux
from backends.alerts import format_duration
from backends.config import Config, ConfigError, HostConfig, load_config
from backends.deliver import Delivery, Sent
from backends.ship import ShipError
from backends.hosts import Host, HostError
from backends.logparse import Progress
from backends.relaunch import relaunch
from backends.runs.status import describe
from training.contract import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, RUN_ID_EXAMPLE, UsageError


class _Said(UsageError):
    """A usage error whose message already names the command (`trackside kill: …`)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise _Said(f"{self.prog}: {message}")


def _grace(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}")
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected seconds >= 0, got {text!r}")
    return value


def _count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return int(text)


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


def _parser() -> _Parser:
    parser = _Parser(prog="trackside", description="Start, list, stop and relaunch runs in tmux on a host; read its GPUs.")
    commands = parser.add_subparsers(dest="subcommand", required=True)

    def command(name: str, help: str) -> _Parser:
        sub = commands.add_parser(name, help=help, description=help)
        sub.add_argument("--host", help="a host of the config file (default: its first host; without one, this machine)")
        sub.add_argument("--config", metavar="PATH", help="config file (default ~/.config/trackside/config.toml)")
        sub.add_argument("--json", action="store_true", help="print one JSON document")
        return sub

    launch = command("launch", "Run a command (given after --) in a new tmux session with a run directory.")
    launch.add_argument("--session", help=f"tmux session name (default {runs.session_name('<run id>')})")
    launch.add_argument("--hosts", type=_names, metavar="H1,H2,…",
                        help="run the trainer on every one of these hosts as one torchrun job (c10d rendezvous on the first)")
    launch.add_argument("--nproc-per-node", type=_count, metavar="N", help="with --hosts: processes per host (default 1)")
    launch.add_argument("--rdzv-host", type=_address, metavar="ADDR",
                        help="with --hosts: the address the other hosts reach the first by (default: its configured address)")
    ship_help = ("send the local training package to the host first (to <runs_root>/code/<hash>/, only what changed) "
                 "and run the trainer from it, and the host's [[sync]] directories (default: the host's `ship` setting)")
    launch.add_argument("--ship", action=argparse.BooleanOptionalAction, help=ship_help)
    command("runs", "List runs and every other tmux session on the host.")
    command("gpus", "Read the host's GPUs once: power against its limit, memory, utilisation, "
                    "temperature, and the processes holding memory (what the dashboard's GPU panel shows).")
    stop = command("kill", "Stop a run's own process tree, then verify its GPU memory is released.")
    stop.add_argument("target", metavar="RUN_OR_SESSION")
    stop.add_argument("--grace", type=_grace, help=f"seconds between SIGTERM and SIGKILL (default from config, {kill.GRACE_S:g})")
    stop.epilog = (
        "Exits 1 when the run had already ended (its exit status is named; nothing is stopped or closed), "
        "2 when RUN_OR_SESSION is the tmux session this trackside itself runs in (refused)."
    )
    again = command("relaunch", "Launch a run again with changed parameters.")
    again.add_argument("run", metavar="RUN")
    again.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                       help=f"change a parameter ({', '.join(params.PARAMS)})")  # fmt: skip
    again.add_argument("--resume", action="store_true", help="start from the parent's latest checkpoint")
    again.add_argument("--ship", action=argparse.BooleanOptionalAction,
                       help="send the code here again first, from where the parent's came (else as `launch --ship`); "
                            "without, the child runs the parent's code (default: the host's `ship` setting)")
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
    if args.subcommand == "launch" and args.hosts is None:
        given = [flag for flag, value in (("--nproc-per-node", args.nproc_per_node), ("--rdzv-host", args.rdzv_host)) if value]
        if given:
            raise UsageError(f"trackside launch: {given[0]} goes with --hosts")
    if args.subcommand == "launch" and args.hosts is not None and args.host is not None:
        raise UsageError("trackside launch: --host and --hosts: give one")
    if args.subcommand == "launch" and args.hosts is not None and args.ship:
        raise UsageError("trackside launch: --ship is for a run on one host, not --hosts")
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


def _check_nodes(args, config: Config, hosts: dict[str, Host]) -> None:
    """A multi-node launch's usage errors (exit 2): a --hosts name the config lacks, a
    command that is not the trainer, a first host the others cannot reach as configured."""
    for name in args.hosts:
        try:
            config.host(name)
        except ConfigError as e:
            raise UsageError(f"trackside launch: --hosts: {e.problem}") from None
    if runs.train_args_start(args.command, config.host(args.hosts[0]).train_command) is None:
        raise UsageError(f"trackside launch: --hosts runs the trainer (-- trackside train …), not {args.command[0]}")
    if args.rdzv_host is None:
        try:
            nodes.rendezvous_host([hosts[name] for name in args.hosts])
        except runs.RunError as e:
            raise UsageError(f"trackside launch: --hosts: {e}") from None


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
    """What was shipped, what was launched where, and how its start was judged
    (backends.runs.launch)."""
    parent = f" (from {doc['parent']})" if doc.get("parent") else ""
    shipped = "".join(f"shipped {line}\n" for line in sent.said()) if sent is not None else ""
    if doc.get("nodes"):
        where = "".join(f"\nnode {i} on {n['host']}: tmux session {n['session']}, run dir {n['run_dir']}" for i, n in enumerate(doc["nodes"]))
        return f"launched {doc['run_id']}{parent} on {len(doc['nodes'])} hosts{where}\n{judged}"
    return f"{shipped}launched {doc['run_id']}{parent} on {doc['host']} in tmux session {doc['session']}\nrun dir: {doc['run_dir']}\n{judged}"


def _show_progress(p: Progress) -> str:
    """`Epoch 2 450/1000, ETA 0:00:36`: a foreign run's bar as its pane shows it."""
    eta = "" if p.eta_s is None else f", ETA {int(p.eta_s) // 3600}:{int(p.eta_s) % 3600 // 60:02d}:{int(p.eta_s) % 60:02d}"
    return f"{p.label or p.phase} {p.done}/{p.total}{eta}"


# What the dashboard's fleet shows of a run (tokens/s, a DFlash run's τ, ETA), and more.
RUN_COLUMNS = ("RUN", "SESSION", "STATE", "STEP", "LOSS", "TOK/S", "τ", "ETA", "PARAMS", "PIDS")


def _show_nodes(r: runs.RunInfo) -> list[tuple[str, ...]]:
    """A multi-node run's nodes, each a row under its run: its host, state and PIDs."""
    blank = ("",) * (len(RUN_COLUMNS) - 4)
    return [
        ("", f"  node {n.node} on {n.host}", n.state + (f" ({n.exit_status})" if n.exit_status is not None else ""),
         *blank, " ".join(map(str, n.pids)) or "-")
        for n in r.nodes
    ]  # fmt: skip


def _show_runs(infos: list[runs.RunInfo], *, by_host: bool = False) -> str:
    """The listing as a table; `by_host`, a HOST column first (several hosts listed)."""
    if not infos:
        return "no runs and no tmux sessions"
    rows = [("HOST",) * by_host + RUN_COLUMNS]
    for r in infos:
        state = describe(r)
        if runs.launcher_code(r.end_status, r.exit_status):
            state += f" (launcher exit {r.exit_status})"
        loss = f"{r.last_loss:.4g}" if isinstance(r.last_loss, (int, float)) else "-"
        step = str(r.last_step if r.last_step is not None else "-") + (f" ({_show_progress(r.progress)})" if r.progress else "")
        rate = f"{r.tokens_per_s:,.0f}" if isinstance(r.tokens_per_s, (int, float)) else "-"
        tau = f"{r.tau:.2f}" if isinstance(r.tau, (int, float)) else "-"
        eta = format_duration(r.eta_s) if r.eta_s is not None and r.state is runs.RunPhase.RUNNING else "-"
        rows.append((r.host,) * by_host + (
            r.run_id or "-", r.session, state, step, loss, rate, tau, eta,
            " ".join(f"{k}={v}" for k, v in r.params.items()) or "-", " ".join(map(str, r.pids)) or "-",
        ))  # fmt: skip
        rows += [("",) * by_host + row for row in _show_nodes(r)]
    return _table(rows)


def _table(rows: list[tuple[str, ...]]) -> str:
    """Rows in aligned columns, two spaces apart; the last column as it is (it may be long)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join([*(c.ljust(w) for c, w in zip(row, widths)), row[-1]]).rstrip() for row in rows)


def _gpus_json(snapshot: gpu.GpuSnapshot) -> dict:
    return {"status": snapshot.status.value, "message": snapshot.message, "source": snapshot.source,
            "gpus": [dataclasses.asdict(g) for g in snapshot.gpus],
            "processes": [dataclasses.asdict(p) for p in snapshot.processes]}


def _show_gpus(host: str, snapshot: gpu.GpuSnapshot) -> str:
    if not snapshot.ok:
        return f"{host}: {snapshot.message or snapshot.status.value}"

    def of(value, limit, unit: str, scale: float = 1.0, digits: int = 0) -> str:
        shown = [f"{v / scale:.{digits}f}" if v is not None else "?" for v in (value, limit)]
        return f"{shown[0]}/{shown[1]} {unit}"
    rows = [("GPU", "NAME", "POWER", "MEMORY", "UTIL", "TEMP")]
    for g in snapshot.gpus:
        rows.append((str(g.index), g.name or "-", of(g.power_w, g.power_limit_w, "W"),
                     of(g.mem_used_mib, g.mem_total_mib, "GiB", 1024, 1),
                     f"{g.util_pct}%" if g.util_pct is not None else "-",
                     f"{g.temp_c}°C" if g.temp_c is not None else "-"))
    lines = _table(rows).splitlines()
    lines += [f"PID {p.pid} ({p.name or '?'}) holds {p.used_mib if p.used_mib is not None else '?'} MiB"
              + (f" on GPU {p.gpu_index}" if p.gpu_index is not None else "") for p in snapshot.processes]
    return "\n".join(lines + [f"read by {snapshot.source}"] if snapshot.source else lines)


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
    lines = [*lines, *filter(None, [report.times()]), report.verdict(), *report.notes]
    for node in report.nodes:  # a multi-node run's other nodes, each on its host
        lines += [f"on {node.host}:", *("  " + line for line in _show_kill(node).splitlines())]
    return "\n".join(lines)


async def _everywhere(names: list[str], hosts: dict[str, Host], read) -> tuple[dict[str, object], list[str]]:
    """`read(host)` on every named host at once: what each gave, and a line for each that
    could not be reached; HostError only when none could."""
    got = await asyncio.gather(*(read(hosts[name]) for name in names), return_exceptions=True)
    results = {name: value for name, value in zip(names, got) if not isinstance(value, BaseException)}
    failures = [value for value in got if isinstance(value, BaseException)]
    for error in failures:
        if not isinstance(error, HostError):
            raise error
    if failures and not results:
        raise failures[0] if len(failures) == 1 else HostError(", ".join(names), "no host could be read: " + "; ".join(map(str, failures)))
    return results, [str(error) for error in failures]


async def _holder(target: str, names: list[str], hosts: dict[str, Host]) -> str:
    """The host that holds `target` (a run id, or a tmux session name): one host's name,
    else RunError saying where it was looked for, or UsageError when a session of that
    name is on several hosts."""

    async def holds(host: Host) -> bool:
        if runs.RUN_ID.fullmatch(target):
            try:
                await runs.read_manifest(host, target)
                return True
            except runs.RunError:
                return False
        return bool(await tmux.list_panes(host, tmux.check_session_name(target)))

    found, unreachable = await _everywhere(names, hosts, holds)
    holding = [name for name in names if found.get(name)]
    if len(holding) > 1 and not runs.RUN_ID.fullmatch(target):  # a multi-node run's dir is on each of its hosts
        raise UsageError(f"tmux session {target!r} is on {', '.join(holding)}: say which with --host")
    if not holding:
        lost = f" ({'; '.join(unreachable)})" if unreachable else ""
        what = f"run {target}" if runs.RUN_ID.fullmatch(target) else f"run or tmux session {target!r}"
        raise runs.RunError(f"no {what} on {', '.join(found)}{lost}")
    return holding[0]


async def _run(args) -> tuple[object, str, list[str]]:
    """(JSON document, human text, a line per host that could not be read) for the
    subcommand. Without --host, `runs` and `gpus` read every configured host, `kill` and
    `relaunch` act on whichever host holds the run."""
    config = load_config(args.config)
    hosts = config.make_hosts()  # a multi-node run's other nodes are reached through them
    names = [args.host] if args.host else [e.name for e in config.hosts]
    if args.host:
        config.host(args.host)  # an unknown name is a usage error
    train_commands = {e.name: e.train_command for e in config.hosts}
    smis = {e.name: e.nvidia_smi for e in config.hosts}
    try:
        if args.subcommand == "launch":
            entry = config.host(args.host) if args.host else config.hosts[0]
            sent = None
            if args.hosts:
                _check_nodes(args, config, hosts)
                info = await nodes.launch_nodes(
                    [hosts[name] for name in args.hosts], args.command, args.nproc_per_node or 1, session=args.session,
                    train_commands=train_commands, rdzv_host=args.rdzv_host,
                )  # fmt: skip
            else:
                host = hosts[entry.name]
                if _ships(args, entry):
                    trainer = runs.train_args_start(args.command, entry.train_command) is not None
                    sent = await _delivered(host, entry.delivery(), trainer)
                info = await runs.launch(host, args.command, session=args.session, train_command=entry.train_command, sent=sent)
            doc = _launched(info, relaunch=False, sent=sent)
            return doc, _show_launched(doc, info.judged, sent), []
        if args.subcommand == "runs":

            def gpu_pids(host: Host):
                async def read() -> set[int]:  # what the dashboard's GPU panel shows holding memory
                    return {p.pid for p in (await gpu.read_gpus(host, smis[host.name])).processes}

                return read

            if args.host:
                infos, unread = await nodes.list_spanning(hosts[args.host], hosts, gpu_pids(hosts[args.host])), []
            else:
                listed, unread = await _everywhere(names, hosts, lambda host: runs.list_runs(host, gpu_pids=gpu_pids(host)))
                infos = nodes.merge([info for name in names for info in listed.get(name, [])])
            docs = [{**r.to_json(), "status": describe(r)} for r in infos]
            return docs, _show_runs(infos, by_host=len(names) > 1), unread
        if args.subcommand == "gpus":

            async def read(host: Host) -> gpu.GpuSnapshot:
                snapshot = await gpu.read_gpus(host, smis[host.name])
                if snapshot.status in (gpu.GpuStatus.ERROR, gpu.GpuStatus.DRIVER_ERROR):
                    raise HostError(host.name, snapshot.message or snapshot.status.value)
                return snapshot

            readings, unread = await _everywhere(names, hosts, read)
            if len(names) == 1:
                [(name, snapshot)] = readings.items()
                return _gpus_json(snapshot), _show_gpus(name, snapshot), unread
            docs = [{"host": name, **_gpus_json(snapshot)} for name, snapshot in readings.items()]
            return docs, "\n\n".join(f"{name}:\n{_show_gpus(name, snapshot)}" for name, snapshot in readings.items()), unread
        target = args.target if args.subcommand == "kill" else args.run
        if not (runs.RUN_ID.fullmatch(target) or tmux.SESSION_NAME.fullmatch(target)):
            what = "a run id or a tmux session name" if args.subcommand == "kill" else "a run id"
            raise _Said(f"trackside {args.subcommand}: {target!r} is not {what} (like {RUN_ID_EXAMPLE})")
        name = args.host or await _holder(target, names, hosts)
        host, entry = hosts[name], config.host(name)
        if args.subcommand == "kill":
            grace = args.grace if args.grace is not None else config.defaults.grace_s
            report = await kill.kill_run(host, target, grace_s=grace, smi=entry.nvidia_smi, hosts=hosts, smis=smis)
            return report.to_json(), _show_kill(report), []
        ship = entry.delivery() if _ships(args, entry) else None
        info, sent = await relaunch(hosts, host, args.run, args.changes, args.resume, train_commands=train_commands,
                                    ship=ship, ship_asked=bool(args.ship))  # fmt: skip
        doc = _launched(info, relaunch=True, sent=sent)
        return doc, _show_launched(doc, info.judged, sent), []
    finally:
        await asyncio.gather(*(h.close() for h in hosts.values()))


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
        print(str(e) if isinstance(e, _Said) else f"trackside: {e}", file=sys.stderr)
        return code
    for line in unread:  # a host that could not be read, while others were
        print(f"trackside: {line}", file=sys.stderr)
    print(json.dumps(doc, indent=1) if args.json else text)
    return EXIT_OK
