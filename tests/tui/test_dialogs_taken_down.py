"""A screen closed as it opens: by a key that came with the one that opened it (`k` then
Escape in one read of the terminal), by a screen that takes its place, or by the app
quitting. Its widgets are gone by the time it mounts, and a screen that focused or
validated them there raised (NoMatches: in CI, the kill dialog of a double `R`, and
Textual's Header on a run screen). Each dialog, and the run screen, pushed and popped in
one breath leaves the screen under it and no error; the title line that replaced Header
follows the screen's title."""

from __future__ import annotations

import pytest
from rich.text import Text
from textual import events
from textual.geometry import Size

from backends.history.moments import Moment
from scripts.sample import RUN_KEY, feed, make_app, on_run
from tests.tui.conftest import screen_text, wait_for
from tests.waiting import HANG_S
from tui.screens.alerts import AlertsScreen
from tui.screens.confirm import Confirm
from tui.screens.edit import EditScreen
from tui.screens.fleet import FleetScreen
from tui.screens.help import HelpScreen
from tui.screens.pick_moment import PickMoment
from tui.screens.pick_run import PickRun
from tui.screens.run import RunScreen
from tui.screens.ship import ShipRelaunch

DIALOGS = {
    "confirm": lambda app: Confirm(Text("Kill it?"), "Yes, kill"),
    "help": lambda app: HelpScreen(app.screen),
    "alerts": lambda app: AlertsScreen(),
    "edit": lambda app: EditScreen(app.runs[RUN_KEY], app.hosts[app.runs[RUN_KEY].host], {}),
    "pick run": lambda app: PickRun(RUN_KEY, list(app.runs.values()), set()),
    "pick moment": lambda app: PickMoment([Moment(1.0, "start", "trainer started")], 0.0, [("", "")], 0),
    "ship": lambda app: ShipRelaunch(RUN_KEY, [("training/loop.py", ["changed"])]),
}


@pytest.mark.parametrize("name", DIALOGS)
async def test_a_dialog_closed_as_it_opens_leaves_no_error(name):
    app = make_app()
    async with app.run_test(size=(120, 36)) as pilot:
        await on_run(pilot)
        app.push_screen(DIALOGS[name](app))
        app.pop_screen()
        await pilot.pause(0.3)
        assert isinstance(app.screen, RunScreen) and app.is_running and app.return_code is None, app.screen_stack
        # and opened as usual, it focuses what it did
        dialog = DIALOGS[name](app)
        await app.push_screen(dialog)
        await pilot.pause(0.3)
        assert app.screen is dialog and (app.focused is not None or name in ("help", "alerts")), (name, app.focused)


async def test_a_run_screen_closed_as_it_opens_leaves_no_error():
    """Textual's Header, on a screen closed as it opened, ran its title callbacks after its
    parts were gone and ended the app (NoMatches; CI, a double Enter at the test's end)."""
    app = make_app()
    async with app.run_test(size=(120, 36)) as pilot:
        await feed(pilot)
        app.open_run(RUN_KEY)
        app.pop_screen()
        await pilot.pause(0.3)
        assert isinstance(app.screen, FleetScreen) and app.is_running and app.return_code is None, app.screen_stack
        app.open_run(RUN_KEY)  # and the test ends, taking the app down, in the same breath:
        # an error raised in the app while it closes is raised here, as the block ends


async def test_a_run_screen_resized_as_it_closes_leaves_no_error():
    """A resize fits the GPUs' band after the next refresh; Escape in the same breath took
    the screen's widgets down first, and the fitting ended the app (NoMatches; CI's pilot
    monkey at 160×48, seed 1912560711)."""
    app = make_app()
    async with app.run_test(size=(120, 36)) as pilot:
        await on_run(pilot)
        screen = app.screen
        screen.post_message(events.Resize(Size(100, 30), Size(100, 30)))
        app.pop_screen()
        await pilot.pause(0.3)
        assert isinstance(app.screen, FleetScreen) and app.is_running and app.return_code is None, app.screen_stack
        screen._fit_top()  # and once more, long after: nothing left to fit, nothing raised


async def test_the_title_line_follows_the_screen():
    app = make_app()
    async with app.run_test(size=(120, 36)) as pilot:
        await on_run(pilot)
        assert f"trackside — {RUN_KEY}" in screen_text(app).splitlines()[0]
        app.screen.sub_title = "renamed"
        await wait_for(pilot, lambda: "trackside — renamed" in screen_text(app).splitlines()[0], HANG_S, "the new title")
