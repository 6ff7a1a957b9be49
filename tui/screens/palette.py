"""Textual's command palette, without two crashes the monkeys found.

Page Down or Page Up pressed while the palette's list has its options but no layout yet
raised KeyError inside Textual, and an Enter queued behind the one that ran a command
closed the screen under the palette, then no screen at all (ScreenStackError): Textual
ended the app on each. Both are mended in Textual's private steps
(`tui.textual_compat.CommandPaletteFixes`); `dismiss` here keeps a closed palette from
popping another screen whatever Textual's steps are called.
"""

from __future__ import annotations

from textual.await_complete import AwaitComplete
from textual.command import CommandPalette as TextualCommandPalette

from tui.textual_compat import CommandPaletteFixes


class CommandPalette(CommandPaletteFixes, TextualCommandPalette):
    def dismiss(self, result=None) -> AwaitComplete:
        if self.app.screen is not self:  # closed already: nothing of ours to pop
            return AwaitComplete.nothing()
        return super().dismiss(result)
