"""The base of every dialog: answered once, however many answers are queued; its title and
answers in sight on any terminal down to 80×24, what it says scrolling between them.

Textual's `dismiss` pops whatever screen is on top. A person who presses Enter (a
button's press, delivered as a message) and Escape in one breath answers twice; the
second answer would pop the screen under the dialog, leaving a blank app.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.screen import ModalScreen, ScreenResultType
from textual.widgets import Static

from tui.guard import Guarded
from tui.inert import inert
from tui.screens.taken_down import TakenDown


class Dialog(TakenDown, Guarded, ModalScreen[ScreenResultType]):
    """What it focuses first is its AUTO_FOCUS (Textual's, which finds none where the
    dialog was taken down as it opened: its widgets are gone by its mount)."""

    def dismiss(self, result=None):
        if self.app.screen is not self:
            return None  # already answered: the screen on top now is someone else's
        return super().dismiss(result)


class DialogBody(VerticalScroll):
    """What a dialog says, between its title and its answers: no taller than they leave
    (trackside.tcss), it scrolls what does not fit. Tab stops on it only when it has
    something to scroll, so its keys can read the rest."""

    def allow_focus(self) -> bool:
        return self.allow_vertical_scroll


def split_title(text: Text) -> tuple[Text, Text]:
    """(its first line, the rest): a dialog's title and its scrolling body."""
    end = text.plain.find("\n")
    return (text, Text()) if end < 0 else (text[:end], text[end + 1 :])


def titled(text: Text, text_id: str) -> ComposeResult:
    """A dialog's text: its first line, the title, in sight above the rest, which scrolls
    (the rest's Static is `text_id`)."""
    title, rest = split_title(inert(text))
    yield Static(title, classes="title")
    yield DialogBody(Static(rest, id=text_id))
