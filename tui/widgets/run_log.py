"""The run screen's log (and replay's): Textual's Log kept at its end through a resize."""
from __future__ import annotations

from textual import events
from textual.widgets import Log


class RunLog(Log):
    """Textual's Log, kept at its end through a resize while it was there: a layout change
    that shrank it (the GPUs' band fitted to a short terminal) left it short of its end,
    where it no longer follows new lines."""

    at_end = True

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        self.at_end = new_value >= self.max_scroll_y

    def on_resize(self, event: events.Resize) -> None:
        if self.at_end:
            self.scroll_end(animate=False, immediate=True, x_axis=False)

    def watch_show_horizontal_scrollbar(self, shown: bool) -> None:
        # A line wider than the log brings its scrollbar (overflow-x: auto) after the write
        # scrolled to the end: a row less, and the newest line under the scrollbar.
        if shown and self.at_end:
            self.call_after_refresh(self.scroll_end, animate=False, immediate=True, x_axis=False)
