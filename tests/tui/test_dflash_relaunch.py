"""End to end: a real DFlash training on the CPU in tmux, supervised by the dashboard: its
chart draws the block positions and τ; `e` edits max_anchors with a prediction, `r`
relaunches a child that trains with it, its parent drawn behind it named by the edit."""

from __future__ import annotations


import pytest
from textual.widgets import Input, Static

from backends import runs
from tests.tui.conftest import launch_and_wait_ended, TRAIN, screen_text, wait_for
from tests.waiting import HANG_S
from tui.app import TracksideApp, Watched
from tui.screens.edit import EditScreen
from tui.widgets.loss_chart import LossChart

DFLASH = [*TRAIN, "--drafter", "dflash", "--steps", "3", "--max-seq-len", "128", "--block-size", "4",
          "--max-anchors", "8"]  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(600)  # two trainer starts, each bounded by HANG_S: a slow start fails on its own message
async def test_a_real_dflash_run_charted_edited_in_max_anchors_and_relaunched(local_host):
    parent = await launch_and_wait_ended(local_host, DFLASH)
    app = TracksideApp([Watched(local_host)], poll_interval=0.2)
    async with app.run_test(size=(140, 50)) as pilot:
        key = f"local/{parent.run_id}"
        await wait_for(pilot, lambda: key in app.runs, timeout=10, what="the parent listed")
        app.open_run(key)
        # block 4: three positions, each drawn, τ ahead of them in the legend and in the stats
        legend = lambda: [line for line in screen_text(app).splitlines() if "━━ pos 1  ━━ pos 2  ━━ pos 3" in line]  # noqa: E731
        await wait_for(pilot, lambda: legend() and "τ " in legend()[0].split("━━")[0], timeout=15, what="the positions' legend")
        assert "max_anchors 8" in screen_text(app) and "τ " in str(app.screen.query_one("#stats").render())
        assert app.screen.query_one(LossChart).curves.labels == ["total", "pos 1", "pos 2", "pos 3"]

        await pilot.press("e")
        form = await wait_for(pilot, lambda: isinstance(app.screen, EditScreen) and app.screen.is_mounted and app.screen, timeout=10, what="the edit form")
        assert form.query_one("#param-block_size", Input).value == "4"
        form.query_one("#param-max_anchors", Input).value = "16"
        await wait_for(pilot, lambda: form.changes == {"max_anchors": 16}, timeout=5, what="the edit read")
        cost = form.query_one("#edit-cost", Static)
        await wait_for(pilot, lambda: form.cost_is_current and "predicting" not in cost.render().plain, timeout=20, what="the prediction")
        # steps and time from the run's own; memory has no model of a CPU run's resident set
        assert "steps per epoch" in cost.render().plain and "peak memory      —" in cost.render().plain
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: app.pending.get(key) == {"max_anchors": 16}, timeout=5, what="the edit kept")

        await pilot.press("r")
        child = await wait_for(
            pilot, lambda: next((r for r in app.runs.values() if r.info.parent == parent.run_id), None), timeout=30, what="the child"
        )
        manifest = await runs.read_manifest(local_host, child.info.run_id)
        assert manifest["params"]["max_anchors"] == 16
        assert manifest["argv"][manifest["argv"].index("--max-anchors") + 1] == "16"
        await wait_for(pilot, lambda: app.screen.run_key == child.key, timeout=10, what="the screen on the child")
        await wait_for(pilot, lambda: "┄┄ parent: max_anchors 8 → 16" in screen_text(app), timeout=10, what="the parent's legend")
        # the child trains with it: its start event says so
        await wait_for(pilot, lambda: child.start is not None, timeout=HANG_S, what="the child's start event")
        assert child.start["config"]["dflash"]["max_anchors"] == 16 and child.params["max_anchors"] == 16
