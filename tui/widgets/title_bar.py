"""The title line at the top of every screen: the app's title and the screen's sub-title.

Textual's Header sets its title from callbacks it queues on the app as it mounts; on a
screen closed as it opened (Enter then Escape in one read of the terminal, or the app
quitting just then) they ran after its parts were gone and raised NoMatches, which ended
the app. This line reads both titles when it renders and is redrawn, there and then, when
either changes.
"""

from __future__ import annotations

from textual.content import Content
from textual.widget import Widget


class TitleBar(Widget):
    DEFAULT_CSS = """
    TitleBar {
        dock: top;
        width: 100%;
        height: 1;
        background: $panel;
        color: $foreground;
        content-align: center middle;
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    """

    def on_mount(self) -> None:
        # Plain (not async) watchers run as the value changes: nothing is left queued.
        self.watch(self.app, "title", self._retitle, init=False)
        self.watch(self.screen, "title", self._retitle, init=False)
        self.watch(self.screen, "sub_title", self._retitle, init=False)

    def _retitle(self) -> None:
        self.refresh()

    def render(self) -> Content:
        screen = self.screen
        title = screen.title if screen.title is not None else self.app.title
        sub_title = screen.sub_title if screen.sub_title is not None else self.app.sub_title
        return self.app.format_title(title, sub_title)
