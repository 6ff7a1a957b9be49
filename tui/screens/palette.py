"""Textual's command palette, without two crashes the monkeys found.

Page Down or Page Up pressed while the palette's list has its options but no layout yet
(the keys arrive in the same breath as ctrl+p or a search letter) raises KeyError inside
Textual's OptionList, and Textual ends the app on it. Here such a key does nothing, as it
would on an empty list.

Textual's palette closes by popping whatever screen is on top. Enter pressed again in the
breath after the one that ran a command found the palette already popped: it popped the
screen under it, then no screen at all (ScreenStackError), and Textual ended the app.
Here a palette no longer on top selects and closes nothing.

The overrides are of Textual's private `_action_command_list` and `_select_or_command`
and of `dismiss`: a Textual that renames the private ones simply never calls these, and
`dismiss` alone still keeps a closed palette from popping another screen.
"""

from __future__ import annotations

from textual.await_complete import AwaitComplete
from textual.command import CommandPalette as TextualCommandPalette


class CommandPalette(TextualCommandPalette):
    def _action_command_list(self, action: str) -> None:
        try:
            super()._action_command_list(action)
        except KeyError:
            pass  # the list is not laid out yet: nothing to move through

    def _select_or_command(self, *args, **kwargs) -> None:
        if self.app.screen is self:  # closed already: a queued Enter selects nothing
            super()._select_or_command(*args, **kwargs)

    def dismiss(self, result=None) -> AwaitComplete:
        if self.app.screen is not self:  # closed already: nothing of ours to pop
            return AwaitComplete.nothing()
        return super().dismiss(result)
