"""`!`: every alert since the dashboard started, newest first, with when it was raised and
when (if yet) its cause cleared — for the operator who comes back to a quiet alert bar."""

from __future__ import annotations

import time

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import Static

from backends.alerts import Entry
from tui.screens.dialog import Dialog, DialogBody
from tui.inert import inert


def _clock(when: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(when))


def alerts_table(entries: list[Entry]) -> Table | Text:
    if not entries:
        return Text("No alerts since the dashboard started.", style="dim")
    table = Table.grid(padding=(0, 2))
    table.add_column("raised", no_wrap=True)
    table.add_column("cleared", no_wrap=True)
    table.add_column("alert")
    for entry in reversed(entries):
        up = entry.cleared is None
        mark = Text("▲ " if entry.alert.severity == "error" else "● ", style="bold red" if up else "dim")
        table.add_row(
            _clock(entry.raised),
            Text("still up", style="bold") if up else Text(_clock(entry.cleared), style="dim"),
            mark + inert(Text(entry.alert.text, style="" if up else "dim")),
        )
    return table


class AlertsScreen(Dialog[None]):
    BINDINGS = [Binding("escape,!", "dismiss", "Close", id="trackside.alerts.close")]
    DEFAULT_CSS = """
    #alerts-list { width: 120; }
    """

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog", id="alerts-list"):
            yield Static(Text("Alerts", style="bold"), classes="title")
            yield DialogBody(Static(alerts_table(list(self.app.alert_book.entries)), id="alerts-table"))
            yield Static(Text("Esc or ! closes", style="dim"), classes="closes")

    def on_mount(self) -> None:
        if self.taken_down():
            return
        # A dialog is not the screen the app tells of changes: it reads the book itself.
        self.set_interval(1.0, self.show)
        self.call_after_refresh(self.query_one(DialogBody).focus)  # the arrows scroll a long history

    def show(self) -> None:
        self.query_one("#alerts-table", Static).update(alerts_table(list(self.app.alert_book.entries)))
