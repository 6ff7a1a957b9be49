"""`a`: the selected run's tmux session, attached here (the dashboard suspended while it
is) or switched to inside tmux, in a worker of the "actions" group."""

from __future__ import annotations

import shlex

from textual.app import SuspendNotSupported

from backends import attach, tmux
from backends.hosts import Host, HostError
from tui.guard import Guarded


class AttachAction(Guarded):
    """Mixed into TracksideApp beside RunActions."""

    def action_attach(self) -> None:
        run = self.selected_run()
        if run is None:
            return
        host = self.watched[run.host].host
        if attach.inside_tmux():
            self.run_worker(self._attach_inside_tmux(host, run.info.session), group="actions", exit_on_error=False)
        else:
            self.run_worker(self._attach_here(host, run.info.session), group="actions", exit_on_error=False)

    async def _attach_here(self, host: Host, session: str) -> None:
        # A name starting with '$' is targeted by the session's id, which only the host knows.
        try:
            where = await tmux.target(host, session)
        except HostError as error:
            self.notify(str(error), severity="warning", timeout=15)
            return
        if where is None:
            self.notify(f"cannot open {session}: the host has no such tmux session now", severity="warning", timeout=10)
            return
        argv = attach.attach_argv(host, session, where)
        try:
            with self.suspend():
                status = attach.attach(host, session, where)
        except SuspendNotSupported:
            self.notify(f"this terminal cannot hand over; run: {shlex.join(argv)}", timeout=15)
            return
        if status != 0:
            self.notify(f"{shlex.join(argv)} exited {status}", severity="warning", timeout=10)

    async def _attach_inside_tmux(self, host: Host, session: str) -> None:
        try:
            self.notify(await attach.attach_inside_tmux(host, session), timeout=8)
        except (attach.AttachError, HostError) as error:
            self.notify(str(error), severity="warning", timeout=15)
