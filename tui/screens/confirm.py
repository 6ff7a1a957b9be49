"""A yes/no question whose default answer is No (Escape, n, or Enter on the focused No).

The question's first line is its title: it stays above the rest, which scrolls when it
is taller than the screen, the answers below it always in sight."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Button

from tui.screens.dialog import Dialog, titled


class Confirm(Dialog[bool]):
    AUTO_FOCUS = "#no"  # Enter, pressed without reading, answers No
    BINDINGS = [
        Binding("y", "answer(True)", "Yes", id="trackside.confirm.yes"),
        Binding("n,escape", "answer(False)", "No", id="trackside.confirm.no"),
    ]

    def __init__(self, question: Text, yes: str, *, text_id: str = "question") -> None:
        super().__init__()
        self.question = question
        self.yes = yes
        self.text_id = text_id

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield from titled(self.question, self.text_id)
            with Horizontal(classes="buttons"):
                yield Button("No", id="no", variant="primary")
                yield Button(self.yes, id="yes", variant="error")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
