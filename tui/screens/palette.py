"""Textual's command palette, without its page-key crash.

Page Down or Page Up pressed while the palette's list has its options but no layout yet
(the keys arrive in the same breath as ctrl+p or a search letter) raises KeyError inside
Textual's OptionList, and Textual ends the app on it. Here such a key does nothing, as it
would on an empty list. The override is of Textual's private `_action_command_list`: a
Textual that renames it simply never calls this one.
"""

from __future__ import annotations

from textual.command import CommandPalette as TextualCommandPalette


class CommandPalette(TextualCommandPalette):
    def _action_command_list(self, action: str) -> None:
        try:
            super()._action_command_list(action)
        except KeyError:
            pass  # the list is not laid out yet: nothing to move through
