"""The app `trackside replay` opens: one screen, the run as it was at a moment
(tui/screens/replay.py), over a past read once before it starts (backends/history): no
host is reached while it runs, and nothing it does acts on a run."""

from __future__ import annotations

import os

from textual.app import App

from backends import sanitize
from backends.history import History, Moment
from training.contract import local_runs_root
from tui.guard import RAISE_ERRORS_ENV, ErrorPolicy, error_log_path
from tui.screens.replay import ReplayScreen


class ReplayApp(ErrorPolicy, App):
    CSS_PATH = "trackside.tcss"
    TITLE = "trackside replay"
    read_only = True  # what the footer asks: nothing here changes a run

    def __init__(self, history: History, moments: list[Moment], when: float, *, raise_errors: bool | None = None) -> None:
        super().__init__()
        self.raise_errors = os.environ.get(RAISE_ERRORS_ENV) == "1" if raise_errors is None else raise_errors
        self.history, self.moments, self.when = history, moments, when
        self.error_log = error_log_path(local_runs_root())

    def notify(self, message: str, *, title: str = "", markup: bool = True, **kwargs) -> None:
        """Cleaned and never markup: it may name a run or a session, anyone's."""
        super().notify(sanitize.block(str(message)), title=sanitize.line(title), markup=False, **kwargs)

    def on_mount(self) -> None:
        self.push_screen(ReplayScreen(self.history, self.moments, self.when))
