"""`R` on a run whose code here differs from the code it runs: ship and relaunch, or
relaunch the code it runs, each followed by the kill's own dialog; the files that differ
listed, so what will travel is read before anything is stopped."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Button

from tui.screens.dialog import Dialog, titled

SHIP, KEEP = "ship", "keep"  # the answers; None: neither, nothing happens


def offer_text(key: str, differing: list[tuple[str, list[str]]]) -> Text:
    """The title, then each part that differs (where from → where to) and its files."""
    text = Text()
    text.append(f"Ship the code here and relaunch {key}?\n", style="bold")
    text.append("Its code differs from the code here (M changed, A new, D gone here):\n")
    for where, files in differing:
        text.append(f"\n{where}\n", style="cyan")
        for line in files or ["(the same files; the host's copy differs)"]:
            text.append(f"  {line}\n", style="red" if line.startswith("D ") else "green" if line.startswith("A ") else "")
    text.append("\nSent before the run is stopped; the kill's dialog follows.", style="dim")
    return text


class ShipRelaunch(Dialog[str | None]):
    AUTO_FOCUS = f"#{SHIP}"
    BINDINGS = [
        Binding("s", "answer('ship')", "Ship", id="trackside.ship.ship"),
        Binding("o", "answer('keep')", "Its own code", id="trackside.ship.keep"),
        Binding("n,escape", "answer(None)", "Cancel", id="trackside.ship.cancel"),
    ]

    def __init__(self, key: str, differing: list[tuple[str, list[str]]]) -> None:
        super().__init__()
        self.key = key
        self.differing = differing

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield from titled(offer_text(self.key, self.differing), "ship-files")
            with Horizontal(classes="buttons"):
                yield Button("Cancel", id="cancel")
                yield Button("Its own code", id=KEEP)
                yield Button("Ship and relaunch", id=SHIP, variant="primary")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id if event.button.id in (SHIP, KEEP) else None)

    def action_answer(self, answer: str | None) -> None:
        self.dismiss(answer)
