"""What a screen offers the app, as types: the app asks `isinstance(screen, SelectsRun)`
where it once probed a screen for a method's name, so a renamed method is a type error,
not a key that silently stops working."""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class SelectsRun(Protocol):
    """A screen with a run selected (the fleet's row, the run screen's run): the run
    actions' keys act on it."""

    def selected_run_key(self) -> str | None: ...


@runtime_checkable
class ShowsState(Protocol):
    """A screen drawn from the app's state, told what changed: a host, a run, its new
    metrics events or console lines."""

    def state_changed(self, *, host: str | None = None, run: str | None = None, events=(), lines=()) -> None: ...


@runtime_checkable
class Filters(Protocol):
    """A screen whose rows or log lines `/` filters."""

    def action_filter(self) -> None: ...


@runtime_checkable
class FocusesLog(Protocol):
    """A screen with a log tail that `l` gives the room to."""

    def action_log_focus(self) -> None: ...
