"""A default terminal, 80×24, as an operator's first hour finds it (issue 44): the edit
form's error in sight where it is typed, the chart's axis under its legend, the fleet's
columns that matter uncut, and a run key on a host row that says why it did nothing."""

from __future__ import annotations

import pytest
from textual.widgets import Button, DataTable, Input, Static

from tests.tui.conftest import screen_text, wait_for
from tui.keys import KEYS, RUN_ACTIONS
from tui.sample import RUN_KEY, feed, make_app, on_run
from tui.screens.edit import EditScreen

SIZE = (80, 24)


@pytest.mark.parametrize("binding", [b for b in KEYS if b.action in RUN_ACTIONS], ids=lambda b: b.key)
async def test_a_run_key_on_a_host_row_says_to_select_a_run(binding):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await feed(pilot)
        table = app.screen.query_one(DataTable)
        for row, host in [(0, "h200-box"), (3, "laptop")]:  # a host with a run, and one with none
            table.move_cursor(row=row)
            await pilot.pause()
            told = len(getattr(app, "told_in_test", []))
            await pilot.press(binding.key)
            await pilot.pause()
            said = app.told_in_test[told:]
            assert len(app.screen_stack) == 2 and not app.screen.is_modal  # nothing opened
            assert len(said) == 1 and "select a run: " in said[0] and host in said[0], said


def in_sight(app, widget) -> bool:
    """Whether all of `widget` is drawn: not scrolled away, not cut off by the screen's edge."""
    placed = app.screen._compositor.visible_widgets.get(widget)
    return placed is not None and placed[0].height > 0 and placed[1].contains_region(placed[0])


@pytest.mark.parametrize("field", ["max_seq_len", "loss_chunk"])  # the first field, and the last
async def test_the_edit_forms_error_is_in_sight_where_it_is_typed(field):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await on_run(pilot)
        run = app.runs[RUN_KEY]
        app.push_screen(EditScreen(run, app.hosts[run.host], {}))
        await pilot.pause()
        form = app.screen
        form.query_one(f"#param-{field}", Input).focus()
        await pilot.press("ctrl+a", "ctrl+k", *"abc")
        await pilot.pause()
        errors, keep = form.query_one("#edit-errors", Static), form.query_one("#keep", Button)
        assert keep.disabled and f"{field}: 'abc'" in str(errors.render())
        assert in_sight(app, errors) and in_sight(app, keep) and in_sight(app, app.focused), screen_text(app)
        assert f"{field}: 'abc'" in screen_text(app)
        # The diff and the predicted cost are below the fields, reached by scrolling.
        await pilot.press("ctrl+a", "ctrl+k", *"4096")
        await wait_for(pilot, lambda: form.cost_is_current, 10, "the cost predicted")
        body = form.query_one("#edit-body")
        body.scroll_end(animate=False, immediate=True)
        await pilot.pause()
        assert in_sight(app, form.query_one("#edit-diff")) and in_sight(app, form.query_one("#edit-cost")), screen_text(app)
        assert f"{field}: " in screen_text(app) and "4096" in screen_text(app), screen_text(app)
