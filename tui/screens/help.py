"""`?`: the dashboard's own keys for the screen in view, from the one bindings table."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import Static

from tui.screens.dialog import Dialog, DialogBody
from tui.keys import DESCRIPTIONS, KEYS, READ_ONLY_HIDDEN


def key_label(binding: Binding) -> str:
    return binding.key_display or binding.key.split(",")[0]


def keys_table(app, screen: Screen) -> Table:
    """The app's keys as they stand on `screen` (dim where the selection cannot take
    them), then the screen's own."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold cyan", no_wrap=True)
    table.add_column()
    for binding in KEYS:
        allowed = app.action_allowed(binding.action, screen)
        if allowed is False and app.read_only and binding.action in READ_ONLY_HIDDEN:
            # Hidden from the footer and the palette, but a viewer looking for the key
            # learns why it is not there.
            table.add_row(Text(key_label(binding), style="dim"), Text.assemble(
                (DESCRIPTIONS[binding.action], "dim"), ("  (read-only dashboard)", "dim italic")
            ))  # fmt: skip
            continue
        if allowed is False:
            continue
        text = Text(DESCRIPTIONS[binding.action], style="" if allowed else "dim")
        if allowed is None:
            text.append("  (not for this selection)", style="dim italic")
        table.add_row(key_label(binding), text)
    for binding in screen.BINDINGS:
        if isinstance(binding, Binding) and binding.show:
            table.add_row(key_label(binding), binding.tooltip or binding.description)
    table.add_row("ctrl+p", "Every action by name (the command palette)")
    return table


class HelpScreen(Dialog[None]):
    BINDINGS = [Binding("escape,question_mark", "dismiss", "Close", id="trackside.help.close")]

    def __init__(self, under: Screen) -> None:
        super().__init__()
        self.under = under

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog", id="help"):
            yield Static(Text("Keys", style="bold"), classes="title")
            yield DialogBody(Static(keys_table(self.app, self.under), id="help-keys"))
            yield Static(Text("Esc or ? closes", style="dim"), classes="closes")

    def on_mount(self) -> None:
        # Once laid out, the keys that do not fit can be scrolled to with the arrows.
        if not self.taken_down():
            self.call_after_refresh(self.query_one(DialogBody).focus)
