"""`trackside kill`: stop a run's own process tree, then verify its GPU memory is
released (backends.kill), and say how it went, as text or the kill report's JSON."""

from __future__ import annotations

from backends import kill, ranges
from tui.commands.flags import bounded
from tui.commands.shared import Fleet


def add_parser(command) -> None:
    stop = command("kill", "Stop a run's own process tree, then verify its GPU memory is released.")
    stop.add_argument("target", metavar="RUN_OR_SESSION")
    stop.add_argument("--grace", type=bounded(ranges.GRACE), help=f"seconds between SIGTERM and SIGKILL (default from config, {kill.GRACE_S:g})")
    stop.epilog = (
        "Exits 1 when the run had already ended (its exit status is named; nothing is stopped or closed), "
        "2 when RUN_OR_SESSION is the tmux session this trackside itself runs in (refused)."
    )


def show_kill(report: kill.KillReport) -> str:
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
        lines += [f"on {node.host}:", *("  " + line for line in show_kill(node).splitlines())]
    return "\n".join(lines)


async def run(args, fleet: Fleet, name: str) -> tuple[dict, str, list[str]]:
    """`kill` of the target on host `name`."""
    grace = args.grace if args.grace is not None else fleet.config.defaults.grace_s
    report = await kill.kill_run(fleet.hosts[name], args.target, grace_s=grace, smi=fleet.smis[name], hosts=fleet.hosts, smis=fleet.smis)
    return report.to_json(), show_kill(report), []
