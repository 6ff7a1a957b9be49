"""A default terminal, 80×24, as an operator's first hour finds it (issue 44): the edit
form's error in sight where it is typed, the chart's axis under its legend, the fleet's
columns that matter uncut, and a run key on a host row that says why it did nothing."""

from __future__ import annotations

import pytest
from textual.widgets import DataTable

from tui.keys import KEYS, RUN_ACTIONS
from tui.sample import feed, make_app

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
