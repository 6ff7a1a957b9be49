"""`trackside replay`'s `m`: every moment that mattered in the run's past, in time order,
each with its mark; Enter goes to it."""

from __future__ import annotations

import time

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from backends.history import Moment
from tui.inert import inert
from tui.screens.dialog import Dialog
from tui.state import format_duration


def choice(moment: Moment, start: float, mark: tuple[str, str]) -> Text:
    symbol, style = mark
    text = Text(f"{symbol} ", style=style)
    text.append(time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(moment.time)))
    text.append(f" +{format_duration(max(0.0, moment.time - start))}  ", style="dim")
    text.append(moment.text)
    return inert(text)


class PickMoment(Dialog[float | None]):
    """Dismisses with the picked moment's time, or None."""

    BINDINGS = [Binding("escape,m", "cancel", "Cancel", id="trackside.pick_moment.cancel")]

    def __init__(self, moments: list[Moment], start: float, marks: list[tuple[str, str]], near: int) -> None:
        super().__init__()
        self.moments, self.start, self.marks, self.near = moments, start, marks, near

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(Text("The moments that mattered (Enter goes there)", style="bold"), classes="title")
            yield OptionList(*(Option(choice(m, self.start, mark)) for m, mark in zip(self.moments, self.marks)), id="pick-moment")

    def on_mount(self) -> None:
        if self.taken_down():
            return
        options = self.query_one(OptionList)
        options.highlighted = self.near
        options.focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(self.moments[event.option_index].time)

    def action_cancel(self) -> None:
        self.dismiss(None)
