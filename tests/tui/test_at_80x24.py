"""A default terminal, 80×24, as an operator's first hour finds it (issue 44): the edit
form's error in sight where it is typed, the chart's axis under its legend, the fleet's
columns that matter uncut, and a run key on a host row that says why it did nothing."""

from __future__ import annotations

import json

import pytest
from rich.cells import cell_len
from textual.widgets import Button, DataTable, Input, Static

from backends.logs.series import Overlay, from_metrics
from tests.tui.conftest import screen_text, wait_for
from tui.keys import KEYS, RUN_ACTIONS
from tui.curves import Curves, Overlaid
from tui.messages import OverlaysRead
from scripts.sample import (
    CHILD_ID, DFLASH_KEY, RUN_ID, RUN_KEY, child_metrics_events, dflash_events, dflash_info, feed, feed_foreign, make_app,
    on_run,
)  # fmt: skip
from tui.screens.edit import EditScreen
from tui.screens.fleet import COLUMNS
from tui.state import RunState
from tui.widgets.loss_chart import LossChart, draw

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


def parent_and_picked() -> dict:
    """What `o` and a relaunch draw behind the sample run: its parent's curve and a run picked
    from the fleet, each named as the app names them."""
    series = from_metrics(CHILD_ID, "h200-box", "".join(json.dumps(e) + "\n" for e in child_metrics_events()))
    return {
        f"h200-box/{CHILD_ID}": Overlay("parent: max_seq_len 16384 → 8192, ttt_steps 5 → 3", series),
        "h200-box/their-sft": Overlay("their-sft", series),
    }


@pytest.mark.parametrize("overlaid", [False, True], ids=["alone", "with-parent-and-picked"])
async def test_the_chart_keeps_its_x_axis_under_a_legend_of_one_line(overlaid):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await on_run(pilot)
        if overlaid:
            app.post_message(OverlaysRead(RUN_KEY, parent_and_picked()))
            await wait_for(pilot, lambda: "┄┄ their-sft" in screen_text(app), 10, "the overlays' legend")
        chart = app.screen.query_one(LossChart)
        await wait_for(pilot, lambda: chart.curves.labels, 10, "the curves plotted")
        await pilot.pause()
        shown = screen_text(app).splitlines()
        assert in_sight(app, chart), "\n".join(shown)
        axis = next((i for i, line in enumerate(shown) if " └┬" in line), None)
        assert axis is not None, "\n".join(shown)
        assert shown[axis + 1].split()[::len(shown[axis + 1].split()) - 1] == ["1", "300"], "\n".join(shown)
        legend = next((i for i, line in enumerate(shown) if "total" in line), None)
        assert legend is not None, "\n".join(shown)
        assert all(name in shown[legend] for name in chart.curves.labels), "\n".join(shown)
        rows = axis - legend - 1 - overlaid
        assert rows >= 4, "\n".join(shown)  # the curves' own rows, between the legends and the axis


def test_a_dflash_legend_and_long_overlay_names_fit_one_line_each_of_80_columns():
    """τ and every block position's name on the title's line; two ancestors whose names
    together outrun the line, each cut to its share (both colours named), not wrapped."""
    run = RunState(DFLASH_KEY, "h200-box", dflash_info())
    for event in dflash_events():
        run.add_event(event)
    curves = Curves(0.3)
    curves.update(run)
    long = "grandparent: max_seq_len 8192 → 16384, ttt_steps 3 → 5, code 1a2b3c4 → 9f8e7d6"
    series = parent_and_picked()[f"h200-box/{CHILD_ID}"].series
    overlaid = [Overlaid(Overlay(long, series), 0.3), Overlaid(Overlay(long.replace("grand", ""), series), 0.3)]
    lines = draw(curves, 80, 16, False, overlaid).plain.splitlines()
    assert len(lines) == 16 and all(len(line) <= 80 for line in lines)
    assert "τ " in lines[0] and all(name in lines[0] for name in curves.labels), lines[0]
    assert lines[1].count("┄") == 2 and lines[1].count("…") == 2 and "grandparent: max_seq_len" in lines[1], lines[1]


async def test_the_fleet_at_80_columns_shows_what_an_operator_needs_uncut():
    """A run's id, state, step, loss, tokens/s and ETA, each whole, with no column past the
    screen's edge (the run id scrolled away with them); a wider terminal shows more."""
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await feed_foreign(pilot)
        table = app.screen.query_one(DataTable)
        shown = [c.key.value for c in table.ordered_columns]
        assert {"name", "state", "step", "loss", "tps", "eta"} <= set(shown), shown
        assert sum(c.get_render_width(table) for c in table.ordered_columns) <= table.scrollable_content_region.width
        assert table.max_scroll_x == 0
        for row in table.ordered_rows:
            for column, cell in zip(table.ordered_columns, table.get_row(row.key)):
                assert cell_len(str(cell)) <= column.width, (row.key.value, column.key.value, str(cell))
        text = screen_text(app)
        assert RUN_ID in text and "300" in text and "ETA" in text and "tokens/s" in text, text
    wide = make_app()
    async with wide.run_test(size=(180, 48)) as pilot:
        await feed_foreign(pilot)
        assert [c.key.value for c in wide.screen.query_one(DataTable).ordered_columns] == [key for key, _, _ in COLUMNS]
