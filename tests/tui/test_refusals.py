"""A key that cannot act on the selected run says why, as `k` on the dashboard's own
session always did: `k` on an ended run, `e`/`r` on a session trackside did not launch,
`a` on a run whose tmux session is gone. Sessions gone from their host's listing leave
the fleet a minute later; `o` never offers the dashboard's own session."""

from __future__ import annotations

import dataclasses

import pytest

from backends.runs import RunPhase
from tests.tui.conftest import screen_text
from tui.store import GONE_KEEP_S
from tui.messages import RunsListed
from scripts.sample import (
    FOREIGN_KEY,
    NOW,
    RUN_KEY,
    dashboard_info,
    feed,
    feed_foreign,
    foreign_info,
    make_app,
    run_info,
)
from tui.screens.fleet import FleetScreen
from tui.screens.pick_run import PickRun
from tui.screens.run import RunScreen


def listening(app) -> list[str]:
    said: list[str] = []
    notify = app.notify
    app.notify = lambda message, **kw: (said.append(str(message)), notify(message, **kw))[1]
    return said


async def open_on(pilot, key: str) -> None:
    pilot.app.open_run(key)
    await pilot.pause()


async def press_on(pilot, key: str, press: str) -> None:
    await open_on(pilot, key)
    await pilot.press(press)
    await pilot.pause(0.3)


@pytest.mark.parametrize(
    "key, press, info, why",
    [
        (RUN_KEY, "k", lambda: run_info(RunPhase.EXITED), "has ended"),
        (RUN_KEY, "R", lambda: run_info(RunPhase.EXITED), "has ended"),
        (FOREIGN_KEY, "e", foreign_info, "not launched by trackside"),
        (FOREIGN_KEY, "r", foreign_info, "not launched by trackside"),
        (RUN_KEY, "a", lambda: dataclasses.replace(run_info(RunPhase.EXITED), session_open=False), "tmux session eagle3-8k is gone"),
    ],
)
async def test_a_key_that_cannot_act_says_why(key, press, info, why):
    app = make_app()
    said = listening(app)
    async with app.run_test(size=(120, 36)) as pilot:
        await feed(pilot)
        app.post_message(RunsListed("h200-box", [info()], NOW))
        await pilot.pause()
        await press_on(pilot, key, press)
        assert any(why in m for m in said), said
        assert isinstance(app.screen, RunScreen), app.screen_stack  # no dialog, no edit form
        assert not any("tmux switch-client" in m or "tmux attach" in m for m in said), said
        assert not [w for w in app.workers if w.group == "actions"]


async def test_a_session_gone_from_the_listing_leaves_the_fleet_a_minute_later():
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await feed_foreign(pilot)
        assert FOREIGN_KEY in app.runs
        app.post_message(RunsListed("h200-box", [run_info()], NOW + 5))
        await pilot.pause()
        assert app.runs[FOREIGN_KEY].gone and "hf-sft" in screen_text(app)  # seen to go
        app.post_message(RunsListed("h200-box", [run_info()], NOW + 5 + GONE_KEEP_S + 1))
        await pilot.pause()
        assert FOREIGN_KEY not in app.runs and "hf-sft" not in screen_text(app)
        assert isinstance(app.screen, FleetScreen)


async def test_a_gone_session_open_on_its_screen_stays_while_it_is_read():
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await feed_foreign(pilot)
        await open_on(pilot, FOREIGN_KEY)
        for later in (5, 5 + GONE_KEEP_S + 1):
            app.post_message(RunsListed("h200-box", [run_info()], NOW + later))
            await pilot.pause()
        assert app.runs[FOREIGN_KEY].gone and app.screen.run_key == FOREIGN_KEY


async def test_overlay_never_offers_the_dashboards_own_session():
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await feed_foreign(pilot)
        await press_on(pilot, RUN_KEY, "o")
        assert isinstance(app.screen, PickRun)
        assert FOREIGN_KEY in app.screen.keys and f"h200-box/{dashboard_info().session}" not in app.screen.keys
