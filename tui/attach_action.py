"""`a`: the selected run's tmux session, attached here (the dashboard suspended while it
is) or switched to inside tmux, in a worker of the "actions" group. A component the app
holds, given the app as an `AttachApp`: what it uses of the app, no more."""

from __future__ import annotations

import shlex
from collections.abc import Coroutine
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

from textual.app import SuspendNotSupported
from textual.worker import Worker

from backends import attach, tmux
from backends.hosts import Host, HostError
from tui.state import RunState

if TYPE_CHECKING:
    from tui.watched import Watched


class AttachApp(Protocol):
    """What `a` uses of the app (tui/app.py's TracksideApp)."""

    watched: dict[str, Watched]

    def selected_run(self) -> RunState | None: ...

    def notify(self, message: str, *, title: str = "", **kwargs: Any) -> None: ...

    def run_worker(self, work: Coroutine, *, name: str = "", group: str = "default", exit_on_error: bool = True) -> Worker: ...

    def suspend(self) -> AbstractContextManager[None]: ...


class AttachAction:
    """`a`, on the app it is given."""

    def __init__(self, app: AttachApp) -> None:
        self.app = app

    def attach(self) -> None:
        run = self.app.selected_run()
        if run is None:
            return
        host = self.app.watched[run.host].host
        if attach.inside_tmux():
            self.app.run_worker(self._attach_inside_tmux(host, run.info.session), group="actions", exit_on_error=False)
        else:
            self.app.run_worker(self._attach_here(host, run.info.session), group="actions", exit_on_error=False)

    async def _attach_here(self, host: Host, session: str) -> None:
        # A name starting with '$' is targeted by the session's id, which only the host knows.
        try:
            where = await tmux.target(host, session)
        except HostError as error:
            self.app.notify(str(error), severity="warning", timeout=15)
            return
        if where is None:
            self.app.notify(f"cannot open {session}: the host has no such tmux session now", severity="warning", timeout=10)
            return
        argv = attach.attach_argv(host, session, where)
        try:
            with self.app.suspend():
                status = attach.attach(host, session, where)
        except SuspendNotSupported:
            self.app.notify(f"this terminal cannot hand over; run: {shlex.join(argv)}", timeout=15)
            return
        if status != 0:
            self.app.notify(f"{shlex.join(argv)} exited {status}", severity="warning", timeout=10)

    async def _attach_inside_tmux(self, host: Host, session: str) -> None:
        try:
            self.app.notify(await attach.attach_inside_tmux(host, session), timeout=8)
        except (attach.AttachError, HostError) as error:
            self.app.notify(str(error), severity="warning", timeout=15)
