"""The base of every dialog: answered once, however many answers are queued.

Textual's `dismiss` pops whatever screen is on top. A person who presses Enter (a
button's press, delivered as a message) and Escape in one breath answers twice; the
second answer would pop the screen under the dialog, leaving a blank app.
"""

from __future__ import annotations

from textual.screen import ModalScreen, ScreenResultType

from tui.guard import Guarded


class Dialog(Guarded, ModalScreen[ScreenResultType]):
    def dismiss(self, result=None):
        if self.app.screen is not self:
            return None  # already answered: the screen on top now is someone else's
        return super().dismiss(result)
