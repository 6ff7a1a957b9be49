"""An error in the dashboard's own code is an alert and a logged traceback, not an exit."""

from __future__ import annotations

import pytest
from textual.binding import Binding
from textual.widgets import Static

from tui.guard import Guarded
from scripts.sample import feed, make_app
from tui.screens.fleet import FleetScreen
from tui.widgets.footer import Footer


class BrokenFleet(FleetScreen):
    """A fleet whose action, key handler and async handler raise (as a bug would)."""

    BINDINGS = [Binding("x", "boom", "Boom"), Binding("z", "async_boom", "Async boom")]

    def action_boom(self) -> None:
        raise RuntimeError("boom from an action")

    async def action_async_boom(self) -> None:
        raise ValueError("boom from a coroutine")


class BrokenRender(Guarded, Static):
    def render(self):
        raise KeyError("boom from a render")


async def test_in_the_tests_mode_an_error_ends_the_app_with_its_traceback():
    """The suite runs the dashboard in its tests' mode (the conftest sets it): an error a
    dashboard would survive fails the test that met it, with its traceback."""
    app = make_app()
    assert app.raise_errors
    with pytest.raises(RuntimeError, match="boom from an action"):
        async with app.run_test(size=(120, 40)) as pilot:
            await feed(pilot)
            await app.push_screen(BrokenFleet())
            await pilot.press("x")
            await pilot.pause()
    assert app.return_code == 1


async def test_errors_in_handlers_are_reported_and_the_app_goes_on(tmp_path):
    app = make_app()
    app.raise_errors = False  # the dashboard's own mode, not the tests'
    app.error_log = str(tmp_path / "dashboard-errors.log")
    async with app.run_test(size=(120, 40)) as pilot:
        await feed(pilot)
        await app.push_screen(BrokenFleet())
        await pilot.press("x", "z")
        await pilot.pause()
        await app.screen.mount(BrokenRender("never shown"))
        await pilot.pause()
        assert app.is_running and app.errors >= 3  # a render fails on every frame
        messages = [n.message for n in app._notifications]
        assert any("BrokenFleet.action_boom" in m and "boom from an action" in m for m in messages)
        assert any("BrokenFleet.action_async_boom" in m for m in messages)
        assert any("BrokenRender.render" in m for m in messages)
        # Still serving keys after the errors: the filter opens.
        await pilot.press("slash")
        assert app.screen.query_one("#filter").display
    log = (tmp_path / "dashboard-errors.log").read_text()
    assert "Traceback" in log and "RuntimeError: boom from an action" in log and "KeyError" in log
    assert app.return_code in (0, None)


async def test_a_footer_whose_screen_is_gone_does_not_recompose():
    """The race of issue 21: a recompose queued on a run screen's footer, run after the
    screen was popped (NoScreen from `self.screen`)."""
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await feed(pilot)
        footer = app.screen.query_one(Footer)
        screen = app.screen
        await app.push_screen(FleetScreen())
        await pilot.pause()
        popped = app.screen.query_one(Footer)
        app.pop_screen()
        await pilot.pause()
        assert not popped.is_attached
        await popped.recompose()  # the queued call, now on a detached footer
        assert popped._keys() is None
        assert app.screen is screen and footer.is_attached and app.errors == 0


async def test_a_failing_worker_that_would_end_the_app_is_logged_and_survived(tmp_path):
    """Textual ends the app when a worker started with exit_on_error (its command palette's
    search, which a closing palette can fail, found by the monkey) raises."""
    app = make_app()
    app.error_log = str(tmp_path / "dashboard-errors.log")
    app.raise_errors = False

    async def search_of_a_closed_palette():
        raise LookupError("No nodes match 'CommandList'")

    async with app.run_test(size=(120, 40)) as pilot:
        await feed(pilot)
        app.run_worker(search_of_a_closed_palette(), exit_on_error=True)
        await pilot.pause(0.2)
        assert app.is_running and app.return_code is None and app.textual_errors == 1
        await pilot.press("slash")
        assert app.screen.query_one("#filter").display
    assert "LookupError: No nodes match" in (tmp_path / "dashboard-errors.log").read_text()


async def test_a_key_action_for_a_screen_already_left_does_nothing():
    """Escape, Escape in one breath: the second reached the run screen as it was being
    popped and found its widgets gone (NoMatches; found by the monkey)."""
    from scripts.sample import on_run

    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await on_run(pilot)
        run_screen = app.screen
        app.pop_screen()
        await pilot.pause()
        assert run_screen.action_back() is None and run_screen.action_filter() is None
        assert app.errors == 0 and app.screen is not run_screen

