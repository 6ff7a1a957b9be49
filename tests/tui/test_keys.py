"""Keys on the fixed fleet: help, the command palette, filter, chart toggles, refusals."""

from __future__ import annotations

from textual import events
from textual.widgets import DataTable, Log

from tui.keys import KEYS
from tests.waiting import wait_until
from scripts.sample import RUN_KEY, feed, make_app, on_run
from tui.screens.edit import EditScreen
from tui.screens.help import HelpScreen
from tui.screens.palette import CommandPalette
from tui.screens.run import RunScreen
from tui.widgets.loss_chart import LossChart


async def test_every_key_has_an_id_and_is_in_the_palette():
    assert all(b.id and b.id.startswith("trackside.") for b in KEYS)
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await on_run(pilot)
        titles = [c.title for c in app.get_system_commands(app.screen)]
        for label in ("Kill (k)", "Edit (e)", "Relaunch (r)", "Kill+relaunch (R)", "Attach (a)", "Log (l)", "Filter (/)"):
            assert label in titles
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("question_mark")
        assert isinstance(app.screen, RunScreen)


async def test_fleet_filter_and_enter_opens_the_run():
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await feed(pilot)
        table = app.screen.query_one(DataTable)
        assert table.row_count == 4  # three hosts and one run
        await pilot.press("slash", *"pve")
        assert [k.value for k in table.rows] == ["host:pve-129"]
        await pilot.press("escape")
        assert table.row_count == 4
        table.move_cursor(row=1)
        await pilot.press("enter")
        assert isinstance(app.screen, RunScreen) and app.screen.run_key == RUN_KEY


async def test_chart_toggles_and_log_focus():
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await on_run(pilot)
        chart = app.screen.query_one(LossChart)
        await pilot.press("y", "s")
        assert chart.log_y and chart.smoothing == 0.1
        await pilot.press("l")
        assert app.focused is app.screen.query_one(Log) and app.screen.maximized is app.focused.parent
        await pilot.press("escape")
        assert app.screen.maximized is None


async def test_run_actions_are_off_where_no_run_is_selected():
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await feed(pilot)
        assert app.screen.selected_run_key() == RUN_KEY  # the cursor starts on the first run
        app.screen.query_one(DataTable).move_cursor(row=0)
        await pilot.pause()
        assert app.check_action("kill", ()) is None  # a host row is selected: shown, dimmed
        await pilot.press("k")
        assert len(app.screen_stack) == 2 and not app.screen.is_modal


async def test_enter_pressed_twice_on_a_row_opens_one_run_screen():
    """Both Enters reached the table before the run screen was up: two run screens, one
    over the other (found by the monkey, whose screens then stacked past Python's limit)."""
    app = make_app()
    async with app.run_test(size=(120, 36)) as pilot:
        await feed(pilot)
        for _ in range(2):
            app.post_message(events.Key("enter", "\r"))  # as a terminal delivers a double press
        await pilot.pause(0.3)
        assert [type(s).__name__ for s in app.screen_stack[1:]] == ["FleetScreen", "RunScreen"]


async def test_help_and_alerts_from_the_palette_replace_each_other():
    """The palette runs `?` and `!` over whatever is open: from the help, the alerts
    went over it, the help over those, and so on (the monkey found the stack growing)."""
    app = make_app()
    async with app.run_test(size=(120, 36)) as pilot:
        await on_run(pilot)
        await pilot.press("question_mark")
        for title, shown in [("Alerts (!)", "AlertsScreen"), ("Help (?)", "HelpScreen")] * 3:
            [command] = [c for c in app.get_system_commands(app.screen) if c.title == title]
            app.call_next(command.callback)  # as the palette runs it
            await pilot.pause(0.2)
            assert [type(s).__name__ for s in app.screen_stack[3:]] == [shown], app.screen_stack
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, RunScreen)


async def test_an_offline_hosts_row_says_why_whole():
    """The state column cut the reason to "offline: connection re": the state says
    offline, the row's widest cell says why."""
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await feed(pilot)
        table = app.screen.query_one(DataTable)
        row = [str(table.get_cell("host:pve-129", column)) for column in ("state", "power")]
        assert row == ["offline", "connection refused by 10.0.0.129:22"], row



async def test_a_screen_opened_while_a_list_is_up_takes_the_lists_place():
    """`e` then `?` as a terminal delivers them: the edit form, made after the run's
    parameters were read, went over the help the `?` had opened meanwhile, the help left
    under it (the monkey found the stack growing: help, edit, the alerts over it, the
    palette). A screen opened while a list (help, alerts) is on top takes its place; the
    palette alone goes over a list."""
    app = make_app()
    async with app.run_test(size=(120, 36)) as pilot:
        await on_run(pilot)
        for key, char, shown in (("question_mark", "?", "HelpScreen"), ("exclamation_mark", "!", "AlertsScreen")):
            app.post_message(events.Key("e", "e"))
            app.post_message(events.Key(key, char))
            await wait_until(lambda: isinstance(app.screen, EditScreen), 10, f"the edit form after {shown}")
            await pilot.pause(0.2)
            assert [type(s).__name__ for s in app.screen_stack[2:]] == ["RunScreen", "EditScreen"], app.screen_stack
            await pilot.press("escape")
            await wait_until(lambda: isinstance(app.screen, RunScreen), 10, "the run screen again")
        await pilot.press("question_mark", "ctrl+p")
        await wait_until(lambda: isinstance(app.screen, CommandPalette), 10, "the palette over the help")
        assert [type(s).__name__ for s in app.screen_stack[2:]] == ["RunScreen", "HelpScreen", "CommandPalette"]


async def test_a_key_that_came_with_e_wins_over_its_form():
    """`e` opens its form from a worker, a moment after the key: `e e` in one breath
    opened two forms (the monkey's stack: o's list of runs, two forms over it, the
    palette). The form opens only where the screen `e` was pressed on is still what is
    seen: a second form, or o's list, that came first wins."""
    app = make_app()
    async with app.run_test(size=(120, 36)) as pilot:
        await on_run(pilot)
        app.action_edit()  # both asked for before the first one's worker has started
        app.action_edit()
        await wait_until(lambda: len(app.screen_stack) > 3, 10, "the form")
        await pilot.pause(0.3)
        assert [type(s).__name__ for s in app.screen_stack[2:]] == ["RunScreen", "EditScreen"], app.screen_stack
        await pilot.press("escape")
        await wait_until(lambda: isinstance(app.screen, RunScreen), 10, "the run screen again")
