"""Pick a run of the fleet to draw behind the one on screen (picked again: taken away)."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from tui.screens.dialog import Dialog
from tui.inert import inert
from tui.state import RunState


def choice(run: RunState, shown: bool) -> Text:
    params = "  ".join(f"{k}={v}" for k, v in run.info.params.items())
    text = Text(run.key, style="bold" if shown else "")
    text.append(f"  {run.state_label}", style=run.style)
    text.append(f"  {params}" if params else "", style="cyan")
    text.append("  (drawn: Enter takes it away)" if shown else "", style="dim")
    return inert(text)


class PickRun(Dialog[str | None]):
    """Dismisses with the picked run's key, or None."""

    AUTO_FOCUS = "OptionList"
    BINDINGS = [Binding("escape", "cancel", "Cancel", id="trackside.pick_run.cancel")]
    DEFAULT_CSS = """
    PickRun .title {
        margin-bottom: 1;
    }
    """

    def __init__(self, for_key: str, runs: list[RunState], shown: set[str]) -> None:
        super().__init__()
        self.for_key = for_key
        self.keys = [run.key for run in runs]
        self.runs = runs
        self.shown = shown

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(inert(Text(f"Draw which run's loss behind {self.for_key}?", style="bold")), classes="title")
            yield OptionList(*(Option(choice(run, run.key in self.shown)) for run in self.runs), id="pick-run")

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(self.keys[event.option_index])

    def action_cancel(self) -> None:
        self.dismiss(None)
