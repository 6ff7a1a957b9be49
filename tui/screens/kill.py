"""Kill: a confirmation that names exactly what will stop, then the proof it stopped."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from backends import kill, tmux
from backends.hosts import Host
from tui.state import HostState, RunState
from tui.guard import Guarded


@dataclass(frozen=True)
class KillPlan:
    key: str
    host: str
    session: str
    pids: list[int]
    gpus: list[tuple[int, int, int | None]]  # (gpu index, pid, MiB) of the run's GPU processes
    relaunch: dict | None  # the changed params when this kill is followed by a relaunch


async def kill_plan(host: Host, run: RunState, state: HostState, relaunch: dict | None) -> KillPlan:
    """The processes `backends.kill` will signal: the run's panes' trees, read now."""
    panes = [p for p in await tmux.list_panes(host, run.info.session) if not run.info.run_id or p.pid in run.info.pids]
    pids = sorted(kill.process_tree(await kill.process_table(host), panes))
    processes = getattr(state.gpus, "processes", None) or []
    gpus = [(p.gpu_index, p.pid, p.used_mib) for p in processes if p.pid in pids]
    return KillPlan(run.key, state.name, run.info.session, pids, gpus, relaunch)


def plan_text(plan: KillPlan) -> Text:
    text = Text()
    text.append(f"Stop run {plan.key} on {plan.host}?\n\n", style="bold")
    text.append("tmux session  ", style="dim")
    text.append(f"{plan.session}\n")
    text.append("processes     ", style="dim")
    text.append(", ".join(map(str, plan.pids)) or "none alive")
    text.append("\n              (SIGTERM, then SIGKILL after the grace period)\n")
    text.append("GPUs          ", style="dim")
    if plan.gpus:
        text.append(", ".join(f"GPU {g} (PID {pid}, {mib} MiB)" for g, pid, mib in plan.gpus))
    else:
        text.append("no GPU memory held by these PIDs right now")
    text.append("\n\nNothing else on the host is touched.")
    if plan.relaunch is not None:
        changes = ", ".join(f"{k}={v}" for k, v in plan.relaunch.items()) or "unchanged parameters"
        text.append(f"\nThen relaunch with {changes}.", style="cyan")
    return text


class KillConfirm(Guarded, ModalScreen[bool]):
    BINDINGS = [
        Binding("y", "answer(True)", "Yes, kill", id="trackside.kill.yes"),
        Binding("n,escape", "answer(False)", "No", id="trackside.kill.no"),
    ]

    def __init__(self, plan: KillPlan) -> None:
        super().__init__()
        self.plan = plan

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(plan_text(self.plan), id="kill-plan")
            with Horizontal(classes="buttons"):
                yield Button("No", id="no", variant="primary")
                yield Button("Yes, kill", id="yes", variant="error")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


def report_text(key: str, report) -> Text:
    text = Text()
    text.append(f"Killed {key} in {report.seconds:.1f}s\n\n", style="bold")
    text.append("signalled  ", style="dim")
    text.append((", ".join(map(str, report.signalled)) or "nothing was alive") + "\n")
    if report.killed:
        text.append("SIGKILLed  ", style="dim")
        text.append(", ".join(map(str, report.killed)) + " (outlived the grace period)\n", style="yellow")
    if report.survivors:
        text.append("survivors  ", style="dim")
        text.append(", ".join(map(str, report.survivors)) + "\n", style="bold red")
    text.append("\nGPU memory before → after\n", style="bold")
    if not report.gpus:
        text.append("  no GPU memory was held by the run\n", style="dim")
    for delta in report.gpus:
        freed = delta.after_mib == 0
        text.append(f"  GPU {delta.index}: {delta.before_mib} MiB → ")
        text.append(f"{delta.after_mib} MiB\n", style="green" if freed else "bold red")
    for p in report.stragglers:
        text.append(f"  straggler PID {p.pid} {p.name} holds {p.used_mib} MiB on GPU {p.gpu_index}\n", style="bold red")
    for p in report.other_holders:
        text.append(f"  not this run's, left alone: PID {p.pid} {p.name} holds {p.used_mib} MiB on GPU {p.gpu_index}\n", style="yellow")
    for note in report.notes:
        text.append(f"  {note}\n", style="dim")
    text.append("\n")
    if report.released and not report.stragglers:
        text.append("GPU memory released.", style="bold green")
    else:
        text.append("GPU memory still held.", style="bold red")
    return text


class KillReportScreen(Guarded, ModalScreen[None]):
    BINDINGS = [Binding("escape,enter", "dismiss", "Close", id="trackside.kill.close")]

    def __init__(self, key: str, report) -> None:
        super().__init__()
        self.key = key
        self.report = report

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(report_text(self.key, self.report), id="kill-report")
            with Horizontal(classes="buttons"):
                yield Button("Close", id="close", variant="primary")

    def on_mount(self) -> None:
        self.query_one(Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss()
