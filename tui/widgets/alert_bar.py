"""The alerts line at the top of every screen: what needs the operator now."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from backends.alerts import Alert
from tui.guard import Guarded
from tui.inert import inert


class AlertBar(Guarded, Static):
    shown: list[Alert] | None = None

    def show(self, alerts: list[Alert]) -> None:
        if alerts == self.shown:
            return
        self.shown = alerts
        self.display = bool(alerts)
        text = Text()
        for alert in alerts:
            if text:
                text.append("\n")
            text.append("▲ " if alert.severity == "error" else "● ", style="bold")
            text.append(inert(alert.text))  # names runs, sessions, hosts' errors
        self.update(text)
