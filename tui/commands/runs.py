"""`trackside runs`: every run and tmux session on the configured hosts, as the fleet
shows them (backends.runs.status's words), a table or JSON."""

from __future__ import annotations

from backends import gpu, nodes, pace, runs
from backends.alerts import format_duration
from backends.hosts import Host
from backends.logs.logparse import Progress
from backends.reach import everywhere
from backends.runs.status import describe
from tui.commands.shared import Fleet, table

# What the dashboard's fleet shows of a run (tokens/s, a DFlash run's τ, ETA), and more.
RUN_COLUMNS = ("RUN", "SESSION", "STATE", "STEP", "LOSS", "TOK/S", "τ", "ETA", "PARAMS", "PIDS")


def add_parser(command) -> None:
    command("runs", "List runs and every other tmux session on the host.")


def _show_progress(p: Progress) -> str:
    """`Epoch 2 450/1000, ETA 0:00:36`: a foreign run's bar as its pane shows it."""
    eta = "" if p.eta_s is None else f", ETA {int(p.eta_s) // 3600}:{int(p.eta_s) % 3600 // 60:02d}:{int(p.eta_s) % 60:02d}"
    return f"{p.label or p.phase} {p.done}/{p.total}{eta}"


def _show_nodes(r: runs.RunInfo) -> list[tuple[str, ...]]:
    """A multi-node run's nodes, each a row under its run: its host, state and PIDs."""
    blank = ("",) * (len(RUN_COLUMNS) - 4)
    return [
        ("", f"  node {n.node} on {n.host}", n.state + (f" ({n.exit_status})" if n.exit_status is not None else ""),
         *blank, " ".join(map(str, n.pids)) or "-")
        for n in r.nodes
    ]  # fmt: skip


def show_runs(infos: list[runs.RunInfo], *, by_host: bool = False) -> str:
    """The listing as a table; `by_host`, a HOST column first (several hosts listed)."""
    if not infos:
        return "no runs and no tmux sessions"
    rows, paced = [("HOST",) * by_host + RUN_COLUMNS], False
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
        paced = paced or isinstance(r.tokens_per_s, (int, float)) or (r.eta_s is not None and r.progress is None)
    # The window is said where a number from it is shown (a foreign run's ETA is its bar's).
    return table(rows) + (f"\nTOK/S and ETA: over each run's last {pace.WINDOW_LABEL} of steps" if paced else "")


async def run(args, fleet: Fleet) -> tuple[list, str, list[str]]:
    def gpu_pids(host: Host):
        async def read() -> set[int]:  # what the dashboard's GPU panel shows holding memory
            return {p.pid for p in (await gpu.read_gpus(host, fleet.smis[host.name])).processes}

        return read

    if args.host:
        infos, unread = await nodes.list_spanning(fleet.hosts[args.host], fleet.hosts, gpu_pids(fleet.hosts[args.host])), []
    else:
        listed, unread = await everywhere(fleet.names, fleet.hosts, lambda host: runs.list_runs(host, gpu_pids=gpu_pids(host)))
        infos = nodes.merge([info for name in fleet.names for info in listed.get(name, [])])
    docs = [{**r.to_json(), "status": describe(r)} for r in infos]
    return docs, show_runs(infos, by_host=len(fleet.names) > 1), unread
