"""Kill: a confirmation that names exactly what will stop, then the proof it stopped."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, Static

from backends.kill import KillPlan, holding
from tui.screens.confirm import Confirm
from tui.screens.dialog import Dialog, split_title, titled
from tui.inert import inert


def plan_text(key: str, plan: KillPlan, relaunch: dict | None, resume: bool | None = None) -> Text:
    """The plan, every PID of it on every node: what a Yes signals, and nothing else.
    `resume`: whether the relaunch continues from the run's checkpoint (None: it cannot)."""
    parts = (plan, *plan.nodes)
    text = Text()
    text.append(f"Stop run {key} on {'+'.join(p.host for p in parts)}?\n", style="bold")
    for part in parts:
        text.append("\n")
        if plan.nodes:  # a multi-node run: each node's own processes, on its own host
            node = (part.manifest or {}).get("node")
            text.append(f"{'' if node is None else f'node {node} '}on {part.host}\n", style="bold")
        _plan_part(text, part, alone=not plan.nodes)
    if plan.nodes:
        text.append("\nStopped as one run: torchrun's workers first, SIGKILL to what outlives the grace period.")
        text.append("\nNothing else on these hosts is touched.")
    else:
        text.append("\nNothing else on the host is touched.")
    if relaunch is not None:
        changes = ", ".join(f"{k}={v}" if v is not None else f"{k} cleared" for k, v in relaunch.items()) or "unchanged parameters"
        text.append(f"\nThen relaunch with {changes}", style="cyan")
        if resume is None:
            text.append(".", style="cyan")
        elif resume:
            text.append(", continuing from its checkpoint", style="bold cyan")
            text.append(" (c: start afresh instead).", style="cyan")
        else:
            text.append(", afresh", style="bold cyan")
            text.append(" (c: continue from its checkpoint instead).", style="cyan")
    return text


def plan_pids(plan: KillPlan) -> str:
    """One host's processes of a plan, as every dialog names them."""
    return ", ".join(map(str, plan.pids)) or "—"


def _plan_part(text: Text, plan: KillPlan, *, alone: bool) -> None:
    """One host's part of a plan: its session, PIDs, ranks and GPU holdings."""
    text.append("tmux session  ", style="dim")
    text.append(f"{plan.session}\n")
    text.append("pane PIDs     ", style="dim")
    text.append(", ".join(map(str, plan.pane_pids)) + "\n")
    text.append("processes     ", style="dim")
    text.append(plan_pids(plan))
    text.append("\n              (SIGTERM, then SIGKILL after the grace period)\n" if alone else "\n")
    if plan.first:  # torchrun's workers: one per rank
        text.append("ranks         ", style="dim")
        text.append(", ".join(map(str, plan.first)) + "  (torchrun's workers, among the processes)\n")
    text.append("GPUs          ", style="dim")
    if plan.holdings:
        text.append("\n".join(f"{'' if i == 0 else ' ' * 14}{holding(p)}" for i, p in enumerate(plan.holdings)) + "\n")
    elif plan.gpu_status == "OK":
        text.append("no GPU memory held by these PIDs right now\n")
    elif plan.gpu_status in ("NO_GPU", "NO_SMI"):
        text.append(f"{plan.gpu_message}\n")
    else:
        text.append(f"not read: {plan.gpu_message or plan.gpu_status}\n")
    for p in plan.bystanders:
        text.append(f"{' ' * 14}not this run's, left alone: {holding(p)}\n", style="yellow")
    for note in plan.notes:
        text.append(f"{note}\n", style="dim")


def relaunch_question(key: str, plan: KillPlan) -> Confirm:
    """r on a live run: a second copy beside it doubles its GPU memory. What keeps running
    is named as the kill dialog names it, from the same plan; default No."""
    question = Text()
    question.append(f"Relaunch while {key} still runs?\n\n", style="bold")
    for part in (plan, *plan.nodes):
        where = f" on {part.host}" if plan.nodes else ""
        question.append(f"tmux session {part.session}{where} keeps running (PIDs {plan_pids(part)})\n")
    question.append("Two copies, on a GPU twice the memory.\n")
    question.append("R stops it first, then relaunches.", style="cyan")
    return Confirm(question, "Yes, run both", text_id="relaunch-question")


class KillConfirm(Confirm):
    """The plan `backends.kill` made, to be carried out exactly as shown on Yes. A plan over
    several nodes of eight GPUs each is taller than a screen: it scrolls (Confirm), so every
    PID a Yes signals can be read."""

    BINDINGS = [Binding("c", "toggle_resume", "Resume", id="trackside.kill.resume", show=False)]

    def __init__(self, key: str, plan: KillPlan, relaunch: dict | None = None, resumable: bool = False) -> None:
        super().__init__(plan_text(key, plan, relaunch, False if resumable else None), "Yes, kill", text_id="kill-plan")
        self.key = key
        self.plan = plan
        self.relaunch = relaunch  # the changed params when this kill is followed by a relaunch
        self.resumable = relaunch is not None and resumable
        self.resume = False  # whether that relaunch continues from the run's checkpoint

    def action_toggle_resume(self) -> None:
        if not self.resumable:
            return
        self.resume = not self.resume
        self.question = plan_text(self.key, self.plan, self.relaunch, self.resume)
        # Not composed yet (c right behind R): compose shows the question as it is now.
        for body in self.query("#kill-plan").results(Static):
            body.update(split_title(inert(self.question))[1])


def report_text(key: str, report) -> Text:
    text = Text()
    text.append(f"Killed {key} in {report.seconds:.1f}s\n", style="bold")
    for part in (report, *report.nodes):
        text.append("\n" if part is report else "\n\n")  # after the previous part's verdict
        if report.nodes:  # a multi-node run: what each node's own host saw
            text.append(f"on {part.host}\n", style="bold")
        _report_part(text, part)
    return text


def _report_part(text: Text, report) -> None:
    """One host's part of a kill: what was signalled there, its GPUs, its verdict."""
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
        text.append(f"  straggler: {holding(p)}\n", style="bold red")
    for p in report.other_holders:
        text.append(f"  not this run's, left alone: {holding(p)}\n", style="yellow")
    for note in report.notes:
        text.append(f"  {note}\n", style="dim")
    text.append("\n")
    if times := report.times():  # the GPU free, then the checkpoint durable
        text.append(times + "\n")
    verified = report.released and report.gpu_status == "OK"
    text.append(report.verdict(), style="bold green" if verified else "bold" if report.released is not False else "bold red")


class KillReportScreen(Dialog[None]):
    """The kill's report; after R, how its relaunch goes, said here as it happens: a toast
    would cover the report and its Close at 80×24."""

    AUTO_FOCUS = "Button"
    BINDINGS = [Binding("escape,enter", "dismiss", "Close", id="trackside.kill.close")]
    DEFAULT_CSS = "#kill-answers { height: auto; }"

    def __init__(self, key: str, report, relaunch: tuple[str, bool] | None = None) -> None:
        super().__init__()
        self.key = key
        self.report = report
        self.relaunch = relaunch  # the relaunch's latest word and whether it failed; None: none follows

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield from titled(report_text(self.key, self.report), "kill-report")
            # Docked with the buttons, in sight however long the report.
            with Vertical(id="kill-answers", classes="closes"):
                line = Static(self._relaunch_line(), id="kill-relaunch")
                line.display = self.relaunch is not None  # after k, no line
                yield line
                with Horizontal(classes="buttons"):
                    yield Button("Close", id="close", variant="primary")

    def _relaunch_line(self) -> Text:
        if self.relaunch is None:
            return Text()
        said, failed = self.relaunch
        return inert(Text(said, style="bold red" if failed else "cyan"))

    def relaunch_said(self, said: str, failed: bool = False) -> None:
        """The relaunch's latest word, in place of the one before."""
        self.relaunch = said, failed
        for line in self.query("#kill-relaunch").results(Static):
            line.update(self._relaunch_line())

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss()
