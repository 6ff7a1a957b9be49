"""The operator's actions on a run — kill (after a confirmed plan), relaunch, edit — and
the demo's launch: the app's half that reaches hosts (attach: tui/attach_action.py).

A component the app holds, given the app as an `ActionsApp`: what it uses of the app is
that Protocol, no more; every change of the dashboard's state goes through the app's
Store. Each action that touches a host runs in a worker of the "actions" group and
reports back as a screen or a notification, so a key never waits on the network; a
dialog is awaited in that worker (`push_screen_wait`), read top to bottom.
"""

from __future__ import annotations

import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from textual.screen import Screen
from textual.worker import Worker

from backends import kill, runs
from backends.relaunch import Relaunch, relaunch
from backends.ship.deliver import Delivery, Sent
from tui.screens.run import RunScreen
from tui.state import RunState
from tui.store import Store

if TYPE_CHECKING:
    from tui.watched import Demo, Watched
    from tui.monitor import HostMonitor

QUIT_AGAIN_S = 5.0  # a second q within this quits while a kill is under way
PLAN_KILL, KILL, RELAUNCH = "plan-kill", "kill", "relaunch"


def own_trainer_on_one_host(run: RunState) -> bool:
    """Our trainer's run (its start event read) on one host: what R may relaunch from its
    checkpoint or start early (a multi-node run's checkpoint is on one node only, and its
    nodes are relaunched together)."""
    return bool(run.info.run_id) and not run.info.nodes and run.start is not None


def can_resume(run: RunState) -> bool:
    """Whether R may relaunch `run` from its checkpoint: past its first step too (the stop
    then saves one)."""
    return own_trainer_on_one_host(run) and bool(run.steps)


class ActionsApp(Protocol):
    """What the operator's actions use of the app (tui/app.py's TracksideApp)."""

    store: Store
    watched: dict[str, Watched]
    monitors: dict[str, HostMonitor]
    grace_s: float
    demo: Demo | None
    demo_run: runs.RunInfo | None

    @property
    def screen(self) -> Screen: ...

    def selected_run(self) -> RunState | None: ...

    def shown_screen(self) -> Screen | None: ...

    def shows(self, screen: Screen) -> bool: ...

    def select(self, key: str) -> None: ...

    def changed(self, *, host: str | None = None, run: str | None = None) -> None: ...

    def notify(self, message: str, *, title: str = "", **kwargs: Any) -> None: ...

    def clear_notifications(self) -> None: ...

    def push_screen(self, screen: Screen) -> Any: ...

    async def push_screen_wait(self, screen: Screen) -> Any: ...

    def run_worker(self, work: Coroutine, *, name: str = "", group: str = "default", exit_on_error: bool = True) -> Worker: ...

    def exit(self) -> None: ...


class InFlight:
    """The operator's actions under way, each known by what it does and to which run
    (`kill`, a run's key) from the moment it is started until its worker is done: the
    guard of an action done once, and what q warns of."""

    def __init__(self, app: ActionsApp) -> None:
        self.app = app
        self._workers: dict[tuple[str, str], Worker] = {}

    def start(self, action: str, key: str, work: Coroutine) -> None:
        self._workers = {k: w for k, w in self._workers.items() if not w.is_finished}
        # The name says what it was in an error's report; the registry is what is read.
        self._workers[action, key] = self.app.run_worker(work, name=f"{action} {key}".strip(), group="actions", exit_on_error=False)

    def under_way(self, action: str, key: str = "") -> bool:
        worker = self._workers.get((action, key))
        return worker is not None and not worker.is_finished

    def keys(self, action: str) -> list[str]:
        """The runs `action` is under way for, in the order it was started."""
        return [key for (doing, key), worker in self._workers.items() if doing == action and not worker.is_finished]


class RunActions:
    """The operator's actions, on the app they are given; its keys call the public ones."""

    def __init__(self, app: ActionsApp) -> None:
        self.app = app
        self.in_flight = InFlight(app)
        # Each run's relaunch's latest word and whether it failed: what R's kill report
        # says of it, read when the report opens and updated while it is open.
        self.relaunch_words: dict[str, tuple[str, bool]] = {}
        self._quit_asked = float("-inf")  # when q last met a kill under way

    @property
    def watched(self) -> dict[str, Watched]:
        return self.app.watched

    def _tell_relaunch(self, key: str, said: str, *, failed: bool = False, timeout: float, title: str = "") -> None:
        """A relaunch's word: in the kill report of its run where that is open (a toast
        would cover it), else a toast."""
        from tui.screens.kill import KillReportScreen

        self.relaunch_words[key] = said, failed
        if isinstance(self.app.screen, KillReportScreen) and self.app.screen.key == key:
            self.app.screen.relaunch_said(said, failed)
        else:
            self.app.notify(said, severity="error" if failed else "information", timeout=timeout, title=title)

    async def quit(self) -> None:
        # Quitting ends the kill under way between its SIGTERM and its SIGKILL: a run that
        # ignores SIGTERM would live on, its release never checked. Said first; q again
        # within 5 s quits anyway.
        stopping = self.in_flight.keys(KILL)
        if stopping and time.monotonic() - self._quit_asked > QUIT_AGAIN_S:
            self._quit_asked = time.monotonic()
            self.app.notify(f"stopping {', '.join(stopping)} is under way (its SIGKILL and release check would not happen): "
                        "q again to quit anyway", severity="warning", timeout=QUIT_AGAIN_S)  # fmt: skip
            return
        self.app.exit()

    def kill(self) -> None:
        self._confirm_kill(relaunch=False)

    def kill_relaunch(self) -> None:
        self._confirm_kill(relaunch=True)

    def _confirm_kill(self, *, relaunch: bool) -> None:
        run = self.app.selected_run()
        if run is None:
            return
        # One dialog at a time: keys that come while the plan is still being read (a double
        # press, a key's repeat) stacked a dialog each, for the same run.
        if self.in_flight.under_way(PLAN_KILL):
            return
        # A run being stopped (a trainer checkpoints on SIGTERM: tens of seconds) is not
        # offered again: a second R while the first stopped it relaunched it twice.
        if self._being_stopped(run):
            return
        self.in_flight.start(PLAN_KILL, "", self._plan_kill(run, relaunch))

    def _being_stopped(self, run: RunState) -> bool:
        """Whether a kill of this run is under way (and say so)."""
        if self.in_flight.under_way(KILL, run.key):
            self.app.notify(f"{run.key} is being stopped", timeout=4)
            return True
        return False

    async def _read_plan(self, run: RunState) -> kill.KillPlan:
        """What stopping `run` would signal, read now: the one list of its processes that
        the kill dialog and r's question both show. With every watched host: a multi-node
        run's plan covers each node on its own."""
        watched = self.watched[run.host]
        return await kill.plan_kill(
            watched.host, run.info.run_id or run.info.session, smi=watched.smi,
            hosts={name: w.host for name, w in self.watched.items()},
            smis={name: w.smi for name, w in self.watched.items()},
        )  # fmt: skip

    async def _plan_kill(self, run: RunState, relaunch: bool) -> None:
        from tui.screens.kill import KillConfirm

        try:
            plan = await self._read_plan(run)
        except kill.KillError as refused:  # our own session, a run that ended meanwhile, a gone one
            self.app.notify(str(refused), severity="warning", timeout=8)
            return
        except Exception as error:
            self.app.notify(f"cannot list {run.key}'s processes: {error}", severity="error", timeout=10)
            return

        try:
            offer = await self._ship_offer(run) if relaunch else None
        except Exception as error:  # a tree over its cap, a host that cannot be listed: nothing is stopped
            self.app.notify(f"cannot compare {run.key}'s code with the code here: {error}", severity="error", timeout=10)
            return

        delivery = None
        if offer is not None:
            from tui.screens.ship import SHIP, ShipRelaunch

            offered, differing = offer
            answer = await self.app.push_screen_wait(ShipRelaunch(run.key, differing))
            if not answer:
                return
            delivery = offered if answer == SHIP else None
        asked = KillConfirm(run.key, plan, self.app.store.pending.get(run.key, {}) if relaunch else None, resumable=can_resume(run))
        if await self.app.push_screen_wait(asked):
            self.in_flight.start(KILL, run.key, self._kill(run, plan, relaunch, delivery, asked.resume))

    async def _ship_offer(self, run: RunState) -> tuple[Delivery, list[tuple[str, list[str]]]] | None:
        """For R on a run that shipped or synced code, or on a host that ships by default:
        what it would take, if the code here differs from what the run runs, with the
        files that differ; else None."""
        if not run.info.run_id or len(run.info.nodes) > 1:
            return None
        watched = self.watched[run.host]
        manifest = await runs.read_manifest(watched.host, run.info.run_id)
        delivery = Delivery.of_manifest(manifest) or watched.ship
        if delivery is None:
            return None
        differing = await delivery.changes(watched.host, manifest)
        return (delivery, differing) if differing else None

    async def _kill(self, run: RunState, plan: kill.KillPlan, relaunch: bool, delivery: Delivery | None = None,
                    resume: bool = False) -> None:
        from tui.screens.kill import KillReportScreen

        watched = self.watched[run.host]
        sent = None
        if delivery is not None:  # the code arrives whole before anything is stopped
            self.app.notify(f"shipping the code here to {run.host}…", timeout=3)
            try:
                sent = await delivery.send(watched.host)
            except Exception as error:
                self.app.notify(f"could not ship to {run.host}, {run.key} left running: {error}", severity="error", timeout=15)
                return
            self.app.notify("shipped " + "; ".join(sent.said()), timeout=5)
        self.app.notify(f"stopping {run.key}…", timeout=3)
        if relaunch:
            self.relaunch_words[run.key] = "relaunch: once the run has stopped", False
        self.app.store.kill_started(run.key)
        signalled = time.monotonic()

        # Our trainer on one host, with no synced directory to swap under a process still
        # stopping, is relaunched the moment the SIGTERM is out: it imports while the run
        # stops and waits for its processes to end before it touches the GPU (resuming, for
        # the checkpoint their stop saved too, and refuses to start if there is none). Else
        # the relaunch starts once the GPU is free, and the kill has closed the run's
        # session: a session the user named passes its name on, which it can only once closed.
        early = (relaunch and own_trainer_on_one_host(run) and not (sent and sent.synced)
                 and runs.named_by_user(plan.manifest or {}) is None)

        def relaunch_now(after_pids: list[int] | None = None) -> None:
            self.in_flight.start(RELAUNCH, run.key, self._relaunch(run, sent, resume, after_pids=after_pids))

        def released() -> None:
            freed = f"{run.key}: GPU released in {time.monotonic() - signalled:.1f}s"
            self.app.notify(freed + ("; relaunching…" if relaunch and not early else "; its checkpoint is being made durable"), timeout=5)
            if relaunch and not early:
                relaunch_now()

        try:
            report = await kill.kill_run(watched.host, plan, grace_s=self.app.grace_s, smi=watched.smi, on_released=released,
                                         on_signalled=relaunch_now if early else None)  # fmt: skip
        except Exception as error:
            self.app.store.kill_failed(run.key)
            self.app.notify(f"could not kill {run.key}: {error}", severity="error", timeout=10)
            return
        self.app.store.killed(run.key, report)
        for name in run.hosts:
            self._poll_runs(name)
        # The report says what the stop's toasts said as it went ("stopping…", "the
        # checkpoint is being made durable", the relaunch's): at 80×24 they covered it and
        # its Close, one of them no longer true. Alerts stay in the alerts screen.
        self.app.clear_notifications()
        self.app.push_screen(KillReportScreen(run.key, report, self.relaunch_words.get(run.key) if relaunch else None))
        self.app.changed(run=run.key)

    def relaunch_run(self) -> None:
        run = self.app.selected_run()
        if run is None:
            return
        # One relaunch of a run at a time: a double press on an ended run launched two copies.
        if self.in_flight.under_way(RELAUNCH, run.key):
            return
        if self._being_stopped(run):  # R's relaunch may follow; r again once it has ended
            return
        if run.info.state != runs.RunPhase.RUNNING:
            self.in_flight.start(RELAUNCH, run.key, self._relaunch(run))
            return
        if self.in_flight.under_way(PLAN_KILL):  # one dialog at a time, as k's
            return
        self.in_flight.start(PLAN_KILL, "", self._ask_relaunch(run))

    async def _ask_relaunch(self, run: RunState) -> None:
        """r on a live run: a second copy beside it doubles its GPU memory. Say so, naming
        what keeps running as the kill dialog would name it (its plan), default No."""
        from tui.screens.kill import relaunch_question

        try:
            plan = await self._read_plan(run)
        except kill.AlreadyEnded:  # ended meanwhile: nothing runs beside the relaunch
            self.in_flight.start(RELAUNCH, run.key, self._relaunch(run))
            return
        except Exception as error:
            self.app.notify(f"cannot list {run.key}'s processes: {error}", severity="error", timeout=10)
            return

        if await self.app.push_screen_wait(relaunch_question(run.key, plan)):
            self.in_flight.start(RELAUNCH, run.key, self._relaunch(run))

    async def _relaunch(self, run: RunState, sent: Sent | None = None, resume: bool = False,
                        after_pids: list[int] | None = None) -> None:
        """Relaunch `run`; with `sent` (R's ship), the code sent before the kill, put in
        place now; with `resume`, from its latest checkpoint; with `after_pids`, the run
        still stopping, whose processes the new trainer waits for."""
        changes = self.app.store.pending.get(run.key, {})
        watched = self.watched[run.host]
        described = (", ".join(f"{k}={v}" for k, v in changes.items()) or "unchanged parameters") + (
            ", from its checkpoint" if resume else "")
        self._tell_relaunch(run.key, f"relaunching {run.key} with {described}…", timeout=3)
        try:
            # A run on one host is shown as soon as its session exists, reading `starting`
            # while it loads; the launch returns once its start is judged.
            info, _ = await relaunch(
                Relaunch(watched.host.name, run.info.run_id, changes, resume, sent=sent, after_pids=after_pids or ()),
                {name: w.host for name, w in self.watched.items()}, {name: w.train_command for name, w in self.watched.items()},
                on_started=lambda started: self._show_relaunched(run, started),
            )  # fmt: skip
        except Exception as error:
            self._tell_relaunch(run.key, f"could not relaunch {run.key}: {error}", failed=True, timeout=10)
            return
        new = self._show_relaunched(run, info)
        self.app.store.relaunched(run.key)
        said = "; ".join(filter(None, [info.judged, info.session_note]))
        self._tell_relaunch(run.key, f"relaunched as {new.key}" + (f": {said}" if said else ""), timeout=5, title="relaunch")

    def _show_relaunched(self, run: RunState, info) -> RunState:
        """The relaunched run, adopted; the screen that showed its parent shows it."""
        new = self._adopt(info)
        shown = self.app.shown_screen()
        if isinstance(shown, RunScreen) and shown.run_key == run.key:
            shown.show_run(new.key)
        return new

    def _adopt(self, info) -> RunState:
        """A run this app just launched: known before the next listing, and followed."""
        run = self.app.store.adopted(info)
        self.app.select(run.key)
        for name in run.hosts:
            self._poll_runs(name)
        self.app.changed(host=info.host, run=run.key)
        return run

    def _poll_runs(self, host_name: str) -> None:
        if monitor := self.app.monitors.get(host_name):
            monitor.poll_runs_now()

    async def launch_demo(self) -> None:
        assert self.app.demo is not None
        watched = next(iter(self.watched.values()))
        try:
            info = await runs.launch(watched.host, self.app.demo.argv, session=self.app.demo.session, params=self.app.demo.params)
        except Exception as error:
            self.app.notify(f"could not start the demo run: {error}", severity="error", timeout=30)
            self.app.shown_screen().show_waiting(f"could not start the demo run: {error}")
            return
        self.app.demo_run = info
        run = self._adopt(info)
        shown = self.app.shown_screen()
        if isinstance(shown, RunScreen) and shown.run_key is None:  # the demo's screen, waiting for it
            shown.show_run(run.key)

    def edit(self) -> None:
        from tui.screens.edit import EditScreen

        run = self.app.selected_run()
        if run is None:
            return

        self.app.run_worker(self._edit(run, EditScreen(run, self.app.store.hosts[run.host], self.app.store.pending.get(run.key, {})), self.app.screen),
                        group="dialogs", exit_on_error=False)  # fmt: skip

    async def _edit(self, run: RunState, form, asked_on) -> None:
        # The worker opens the form a moment after the key: a key that came with it (a
        # second e, o's list of runs) has put its own screen there since, and wins.
        if not self.app.shows(asked_on):
            return
        changes = await self.app.push_screen_wait(form)
        if changes is None:
            return
        self.app.store.edited(run.key, changes)
        if changes:
            diff = ", ".join(f"{k} {run.params.get(k)} → {v}" for k, v in changes.items())
            self.app.notify(f"{diff}: press r to relaunch with it", title="edited")
        self.app.changed(run=run.key)
