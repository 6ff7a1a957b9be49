"""The dashboard app: hands each monitor message to the store (`tui.store`, the reducer),
tells the screen in view what changed, speaks the alerts raised, and asks `tui.keys`
which keys act where; what becomes of an error is `tui.guard.ErrorPolicy`'s.

Screens render from `app.hosts` / `app.runs` and are told what changed; the actions that
reach a host (kill, relaunch, launch: `tui.run_actions`) run in workers and report back as
screens and notifications, so the UI never waits on the network.
"""

from __future__ import annotations

import asyncio
import gc
import os
import time
from collections.abc import Callable, Iterable
from functools import partial

from textual import events
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.screen import Screen

from backends import kill, runs, sanitize
from backends.alerts import COMMAND_TIMEOUT_S, Alert, AlertBook, Rules, run_command
from backends.config import Defaults
from backends.logs import series
from training.contract import local_runs_root
from tui.alerts import announce
from tui.escape_cache import bound_escape_cache
from tui.guard import RAISE_ERRORS_ENV, ErrorPolicy, error_log_path
from tui.keys import DESCRIPTIONS, KEYS, RUN_ACTIONS, action_allowed, refusal
from tui.messages import ConsoleBatch, EnergyMetered, GpusPolled, HostFailed, MetricsBatch, OverlaysRead, RunsListed
from tui.monitor import HostMonitor
from tui.attach_action import AttachAction
from tui.run_actions import RunActions
from tui.protocols import Filters, FocusesLog, SelectsRun, ShowsState
from tui.state import RunState
from tui.store import Store
from tui.watched import Demo, Watched


class TracksideApp(ErrorPolicy, App):
    CSS_PATH = "trackside.tcss"
    TITLE = "trackside"
    BINDINGS = KEYS

    # The store's state, as the screens and the operator's actions read it.
    hosts = property(lambda self: self.store.hosts)
    runs = property(lambda self: self.store.runs)
    pending = property(lambda self: self.store.pending)
    alert_book = property(lambda self: self.store.alert_book)
    alerts = property(lambda self: self.store.alerts)

    def __init__(
        self,
        watched: list[Watched],
        *,
        demo: Demo | None = None,
        monitor: bool = True,
        clock: Callable[[], float] = time.time,
        poll_interval: float = Defaults.poll_ms / 1000,
        grace_s: float = kill.GRACE_S,
        alert_rules: Rules = Rules(),
        alert_command: list[str] | None = None,
        alert_timeout_s: float = COMMAND_TIMEOUT_S,
        read_only: bool = False,
        raise_errors: bool | None = None,
    ) -> None:
        super().__init__()
        # The tests' mode (tui.guard): an unexpected error ends the app with its traceback.
        self.raise_errors = os.environ.get(RAISE_ERRORS_ENV) == "1" if raise_errors is None else raise_errors
        self.read_only = read_only
        if read_only:
            self.title = f"{self.TITLE} (read-only)"
        self.watched = {w.host.name: w for w in watched}
        self.demo = demo
        self.demo_run: runs.RunInfo | None = None  # the demo's run, once launched
        self.clock = clock
        self.grace_s = grace_s
        self.store = Store(self.watched, AlertBook(since=clock(), rules=alert_rules))
        self.alert_command = alert_command  # run with each new alert as JSON on its stdin
        self.alert_timeout_s = alert_timeout_s
        self.monitors: dict[str, HostMonitor] = {}
        if monitor:
            self.monitors = {
                name: HostMonitor(self, w.host, smi=w.smi, interval=poll_interval, clock=clock, record=w.record)
                for name, w in self.watched.items()
            }
        # The operator's actions, each given this app (their Protocols say what they use).
        self.actions = RunActions(self)
        self.attacher = AttachAction(self)
        local = next((w.host for w in watched if w.host.is_local), None)
        self.error_log = error_log_path(local.runs_root if local else local_runs_root())

    def notify(self, message: str, *, title: str = "", markup: bool = True, **kwargs) -> None:
        """Every notification (a screen's too), cleaned and never read as markup: most name
        runs, sessions or hosts' errors, which are anyone's (backends.sanitize)."""
        super().notify(sanitize.block(str(message)), title=sanitize.line(title), markup=False, **kwargs)

    def on_mount(self) -> None:
        from tui.screens.fleet import FleetScreen
        from tui.screens.run import RunScreen

        bound_escape_cache()
        # What start-up allocated lives as long as the app: keep it out of the collector's
        # full passes, which otherwise land on key presses (docs/benchmarks.md, load).
        gc.freeze()
        self.push_screen(FleetScreen())
        for monitor in self.monitors.values():
            monitor.start()
        self.set_interval(1.0, self._tick)
        if self.demo is not None:
            self.push_screen(RunScreen(None, waiting=f"starting the demo run in tmux session {self.demo.session}…"))
            self.run_worker(self.actions.launch_demo(), group="actions", exit_on_error=False)

    # --- state from messages: the store's transitions, then what the app says of them --

    def on_gpus_polled(self, message: GpusPolled) -> None:
        self._host_back(message.host, self.store.gpus_polled(message.host, message.snapshot, message.time))
        self.changed(host=message.host)

    def on_energy_metered(self, message: EnergyMetered) -> None:
        self.store.energy_metered(message.host, message.charges, message.why)
        self.changed(host=message.host)

    def on_host_failed(self, message: HostFailed) -> None:
        self.store.host_failed(message.host, message.status, message.message)
        self.changed(host=message.host)

    def on_runs_listed(self, message: RunsListed) -> None:
        self._host_back(message.host, self.store.runs_listed(message.host, message.runs, message.time))
        # Every host's: a multi-node run's metrics move to the node found to hold rank 0.
        for name in self.monitors:
            self._follow_runs(name)
        self.changed(host=message.host)

    def _host_back(self, name: str, back: bool) -> None:
        if back:
            self.notify(f"{name} is back", title="host back")

    def on_metrics_batch(self, message: MetricsBatch) -> None:
        if self.store.metrics_batch(message.key, message.events, message.garbled):
            self.changed(run=message.key, events=message.events)

    def on_console_batch(self, message: ConsoleBatch) -> None:
        lines = self.store.console_batch(message.key, message.lines)
        if lines is not None:
            self.changed(run=message.key, lines=lines)

    def read_overlays(self, key: str, picked: str | None = None) -> None:
        """Read, in a worker, what run `key`'s chart draws behind it: its parent's and
        grandparent's curves, or those of the fleet's run `picked` (picked again: dropped)."""
        self.run_worker(self._read_overlays(key, picked), group="overlays", exit_on_error=False)

    async def _read_overlays(self, key: str, picked: str | None) -> None:
        run = self.runs.get(key)
        if run is None:
            return
        if picked is not None and picked in run.overlays:
            self.post_message(OverlaysRead(key, {}, drop=picked))
            return
        other = self.runs.get(picked) if picked is not None else None
        try:
            if other is None:
                # A relaunch lives on its parent's host, beside it in the runs root.
                line = await series.ancestors(self.watched[run.host].host, run.info.parent)
                read = [(f"{run.host}/{s.name}", relation, s) for relation, s in zip(("parent", "grandparent"), line)]
            else:
                host, info = self.watched[other.host].host, other.info
                s = await (series.of_run(host, info.run_id) if info.run_id else series.of_session(host, info.session))
                read = [(picked, s.name, s)]
        except Exception as error:  # a host lost, a run dir gone: the chart goes on without it
            self.notify(f"cannot read the curves to draw behind {key}: {error}", severity="warning", timeout=8)
            return
        # Named by how this run differs from it, where both have launch params to compare.
        overlays = {
            k: series.Overlay(f"{name}: {series.changed(s.params, run.info.params, s.code, run.info.code)}" if s.params else name, s)
            for k, name, s in read
        }
        self.post_message(OverlaysRead(key, overlays))

    def on_overlays_read(self, message: OverlaysRead) -> None:
        if self.store.overlays_read(message.key, message.overlays, message.drop):
            self.changed(run=message.key)

    def _follow_runs(self, host_name: str) -> None:
        monitor = self.monitors.get(host_name)
        if monitor is None:
            return
        wanted = self.store.followed(host_name)
        for key, run in wanted.items():
            if monitor.follow(key, run.info.run_dir, run.info.session):
                run.reset_streams()  # a new follower replays the files from their start
        for key in monitor.following() - set(wanted):
            monitor.unfollow(key)

    def _tick(self) -> None:
        """Once a second: time-based alerts (stall, under-fed) and ages (stale hosts)."""
        self.changed()

    def changed(self, *, host: str | None = None, run: str | None = None, events=(), lines=()) -> None:
        """The state changed (a host's, a run's, or the time): alerts evaluated, the screen
        in view told."""
        if not self.is_running:
            return  # shutting down: the screens are being taken apart, children first
        self._refresh_alerts()
        # Only the screen in view (under any dialog) repaints; the others catch up on resume.
        shown = self.shown_screen()
        if isinstance(shown, ShowsState):
            shown.state_changed(host=host, run=run, events=events, lines=lines)

    def shown_screen(self) -> Screen | None:
        """The screen in view: the top one, or the one under the dialogs on top."""
        return next((s for s in reversed(self.screen_stack) if not s.is_modal), None)

    def _refresh_alerts(self) -> None:
        now = self.clock()
        for alert in self.store.new_alerts(now):
            self.notify(alert.text, severity=alert.severity, timeout=8)
            announce(self, alert)
            if self.alert_command:
                self.run_worker(self._send_alert(alert, now), group="alerts", exit_on_error=False)

    async def _send_alert(self, alert: Alert, raised: float) -> None:
        problem = await run_command(self.alert_command, alert, raised, self.alert_timeout_s)
        if problem:
            self.notify(problem, severity="warning", timeout=10)

    def action_alerts(self) -> None:
        from tui.screens.alerts import AlertsScreen

        self._open_list(AlertsScreen, lambda under: AlertsScreen())

    def _open_list(self, kind: type[Screen], make: Callable[[Screen], Screen]) -> None:
        """`?` and `!`: one list at a time. Its own key closes it; the other's replaces it
        (push_screen: run from the palette over the other, each went on top, without end)."""
        if isinstance(self.screen, kind):
            self.screen.dismiss()
            return
        self.push_screen(make(self.screen_stack[-2] if self._list_on_top() else self.screen))

    def shows(self, screen: Screen) -> bool:
        """Whether `screen` is what the operator sees: on top, or under a list alone (which a
        screen opened now replaces)."""
        return self.screen is screen or (self._list_on_top() and self.screen_stack[-2] is screen)

    def _list_on_top(self) -> bool:
        from tui.screens.alerts import AlertsScreen
        from tui.screens.help import HelpScreen

        return isinstance(self.screen, (HelpScreen, AlertsScreen))

    def push_screen(self, screen, *args, **kwargs):
        # A list (`?`, `!`) is read, then left: a screen opened while one is on top takes
        # its place. A form its worker opened after the keys that came with its own went
        # over a help opened by one of them, and lists stayed under forms without end. The palette alone
        # goes over a list (its commands then act on the screen under it).
        from tui.screens.palette import CommandPalette

        if self._list_on_top() and not isinstance(screen, CommandPalette):
            self.pop_screen()
        return super().push_screen(screen, *args, **kwargs)

    # --- actions --------------------------------------------------------------------

    async def action_quit(self) -> None:
        await self.actions.quit()

    def action_kill(self) -> None:
        self.actions.kill()

    def action_kill_relaunch(self) -> None:
        self.actions.kill_relaunch()

    def action_relaunch(self) -> None:
        self.actions.relaunch_run()

    def action_edit(self) -> None:
        self.actions.edit()

    def action_attach(self) -> None:
        self.attacher.attach()

    def selected_run(self, screen: Screen | None = None) -> RunState | None:
        screen = screen or self.screen
        key = screen.selected_run_key() if isinstance(screen, SelectsRun) else None
        return self.runs.get(key) if key else None

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return self.action_allowed(action, self.screen)

    def action_allowed(self, action: str, screen: Screen) -> bool | None:
        """Whether a key of the app acts on `screen` (`tui.keys.action_allowed`)."""
        return action_allowed(action, screen, self.selected_run, read_only=self.read_only)

    def on_key(self, event: events.Key) -> None:
        # A run action's key that its binding, disabled for this run, let through: say why.
        # (Textual runs a binding it allows before the key gets here; this one it did not.)
        run = self.selected_run()
        if run is None:
            return
        for binding in KEYS:
            if binding.action in RUN_ACTIONS and event.key in binding.key.split(","):
                if why := refusal(binding.action, run):
                    self.notify(why, severity="warning", timeout=8)
                return

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        for command in super().get_system_commands(screen):
            if command.title == "Screenshot":  # Textual's fails without a word where ~/Downloads is missing
                command = command._replace(help="Save an SVG picture of the screen in the current directory",
                                           callback=lambda: self.set_timer(0.1, self.save_picture))  # fmt: skip
            yield command
        # Asked about the screen the palette was opened on (the palette has no selection).
        for binding in KEYS:
            if binding.action != "quit" and self.action_allowed(binding.action, screen):
                yield SystemCommand(
                    f"{binding.description} ({binding.key_display or binding.key})",
                    DESCRIPTIONS[binding.action],
                    partial(self.run_action, binding.action),
                )
        # The screen's own keys (the run screen's chart toggles, its way back to the fleet).
        for binding in screen.BINDINGS:
            if isinstance(binding, Binding) and binding.id:
                yield SystemCommand(
                    f"{binding.description} ({self.get_key_display(binding)})",
                    binding.tooltip or binding.description,
                    partial(screen.run_action, binding.action),
                )

    def save_picture(self) -> None:
        try:
            path = os.path.abspath(self.save_screenshot())
        except OSError as error:
            self.notify(f"cannot save a screenshot in the current directory: {error.strerror or error}",
                        title="Screenshot", severity="error", timeout=10)  # fmt: skip
            return
        self.notify(f"saved {path}", title="Screenshot", timeout=10)

    def action_command_palette(self) -> None:
        from tui.screens.palette import CommandPalette

        # No id, unlike Textual's own (nothing selects by it): a palette closed a moment ago
        # stays registered until its removal is done, and a new one under the same id was
        # refused (DuplicateIds).
        if self.use_command_palette and not CommandPalette.is_open(self):
            self.push_screen(CommandPalette())

    def search_themes(self) -> None:
        # The palette's "Theme" command: Textual's opens Textual's own palette, whose page
        # keys end the app before its list is laid out (tui/screens/palette.py). Ours, with
        # Textual's theme list.
        from textual.theme import ThemeProvider

        from tui.screens.palette import CommandPalette

        self.push_screen(CommandPalette(providers=[ThemeProvider], placeholder="Search for themes…"))

    def action_help(self) -> None:
        from tui.screens.help import HelpScreen

        self._open_list(HelpScreen, HelpScreen)

    def action_log_focus(self) -> None:
        if isinstance(self.screen, FocusesLog):
            self.screen.action_log_focus()
        elif run := self.selected_run():
            self.open_run(run.key, focus_log=True)

    def action_filter(self) -> None:
        if isinstance(self.screen, Filters):
            self.screen.action_filter()

    def open_run(self, key: str, *, focus_log: bool = False) -> None:
        from tui.screens.run import RunScreen

        self.select(key)
        self.push_screen(RunScreen(key, focus_log=focus_log))

    def select(self, key: str) -> None:
        self.store.selected_run(key)
        if run := self.runs.get(key):
            self._follow_runs(run.host)

    def deselect(self, key: str) -> None:
        self.store.deselected_run(key)
        if run := self.runs.get(key):
            self._follow_runs(run.host)

    async def on_unmount(self) -> None:
        # Let the workers' own clean-up (killing their tail and tmux children) finish
        # while the event loop still runs.
        for monitor in self.monitors.values():
            monitor.stop()
        stopping = [w.wait() for w in self.workers if w.group == "monitor"]
        await asyncio.gather(*stopping, return_exceptions=True)  # cancelled: that is the point
