"""A screen closed while it was being opened: by a key that came with the one that opened
it (Enter then Escape in one read of the terminal), by a screen that took its place, or by
the app quitting. Its widgets are gone by the time it mounts, so its mount asks first."""

from __future__ import annotations


class TakenDown:
    def taken_down(self) -> bool:
        # The app stops running as its shutdown begins, before it takes the screens down.
        return self not in self.app.screen_stack or not self.app.is_running
