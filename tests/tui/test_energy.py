"""A run's GPU-hours and energy so far on the fleet and its run screen (tui/energy.py): the
columns where they fit (80 columns keeps the others uncut), a lower bound and a split
said, and a run without a recording saying why rather than 0."""

from __future__ import annotations

from textual.widgets import DataTable, Static

from backends.recorder.energy import Charge
from scripts.sample import FOREIGN_KEY, RUN_KEY, feed_foreign, make_app, on_run
from tests.tui.conftest import wait_for
from tui.messages import EnergyMetered
from tui.screens.fleet import NARROW

HOUR_AT_450W = Charge(gpu_s=3 * 3600.0, joules=3 * 3600 * 450.0)  # three cards for an hour: 1.35 kWh


def cell(app, row: str, column: str) -> str:
    return str(app.screen.query_one(DataTable).get_cell(row, column))


async def test_the_fleet_shows_gpu_hours_and_kwh_where_they_fit():
    app = make_app()
    async with app.run_test(size=(200, 40)) as pilot:
        await feed_foreign(pilot)
        run, foreign = f"run:{RUN_KEY}", f"run:{FOREIGN_KEY}"
        assert cell(app, run, "gpuh") == "…"  # not read yet: no figure, and no 0
        shared_short = Charge(gpu_s=1800.0, joules=1800 * 300.0, at_least=True, shared=True)
        app.post_message(EnergyMetered("h200-box", {RUN_KEY: HOUR_AT_450W, FOREIGN_KEY: shared_short}, None))
        await wait_for(pilot, lambda: cell(app, run, "gpuh") == "3", 10, "the run's GPU-hours")
        assert cell(app, run, "kwh") == "1.35"
        assert (cell(app, foreign, "gpuh"), cell(app, foreign, "kwh")) == ("≥0.5÷", "≥0.15÷")
        app.post_message(EnergyMetered("h200-box", {}, ("off", "not recorded: the recorder is off for h200-box (record = false)")))
        await wait_for(pilot, lambda: cell(app, run, "kwh") == "rec off", 10, "the recorder off said")
    narrow = make_app()
    async with narrow.run_test(size=(80, 24)) as pilot:
        await feed_foreign(pilot)
        narrow.post_message(EnergyMetered("h200-box", {RUN_KEY: HOUR_AT_450W}, None))
        await pilot.pause()
        shown = [c.key.value for c in narrow.screen.query_one(DataTable).ordered_columns]
        assert set(NARROW) <= set(shown) and "kwh" not in shown, shown


async def test_the_run_screen_says_the_figures_or_why_there_are_none():
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await on_run(pilot)
        stats = app.screen.query_one("#stats", Static)
        app.post_message(EnergyMetered("h200-box", {}, ("none", "the recorder on h200-box has recorded nothing yet")))
        await wait_for(pilot, lambda: "recorded nothing yet" in str(stats.render()), 10, "why there are no figures")
        app.post_message(EnergyMetered("h200-box", {RUN_KEY: Charge(3600.0, 3600 * 300.0, at_least=True, shared=True)}, None))
        await wait_for(pilot, lambda: "kWh" in str(stats.render()), 10, "the figures")
        said = str(stats.render())
        assert "GPU at least 1 h  energy at least 0.3 kWh so far" in said, said
        assert "split by used memory" in said and "misses some of its time" in said, said
