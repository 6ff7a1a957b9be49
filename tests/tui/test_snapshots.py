"""Snapshots of the four screens, from fixed data posted as monitor messages and a frozen clock.

Regenerate after an intended change with `pytest tests/tui/test_snapshots.py --snapshot-update`.
"""

from __future__ import annotations

import pytest

from tests.tui.sample import (
    FOREIGN_KEY, MULTI_KEY, RUN_KEY, feed, feed_foreign, feed_multinode, kill_plan, make_app, make_multinode_app,
    multinode_plan, on_dflash_run, on_run,
)  # fmt: skip
from tui.screens.edit import EditScreen
from tui.screens.kill import KillConfirm

SIZE = (160, 48)


async def fed(pilot) -> None:
    await feed(pilot)


def test_fleet(snap_compare):
    assert snap_compare(make_app(), terminal_size=SIZE, run_before=fed)


def test_fleet_with_a_foreign_run_and_the_dashboards_own_session(snap_compare):
    assert snap_compare(make_app(), terminal_size=SIZE, run_before=feed_foreign)


def test_foreign_run(snap_compare):
    async def run_before(pilot) -> None:
        await feed_foreign(pilot)
        pilot.app.open_run(FOREIGN_KEY)
        await pilot.pause()

    assert snap_compare(make_app(), terminal_size=SIZE, run_before=run_before)


def test_run(snap_compare):
    assert snap_compare(make_app(), terminal_size=SIZE, run_before=on_run)


def test_dflash_run(snap_compare):
    """Its loss at block positions 1, 8 and 15 beside the total, τ by the legend and in the stats."""
    assert snap_compare(make_app(), terminal_size=SIZE, run_before=on_dflash_run)


def test_kill_modal(snap_compare):
    async def run_before(pilot) -> None:
        await on_run(pilot)
        pilot.app.push_screen(KillConfirm(RUN_KEY, kill_plan()))
        await pilot.pause()

    assert snap_compare(make_app(), terminal_size=SIZE, run_before=run_before)


def edit_to(max_seq_len: str):
    async def run_before(pilot) -> None:
        await on_run(pilot)
        app = pilot.app
        run = app.runs[RUN_KEY]
        app.push_screen(EditScreen(run, app.hosts[run.host], {}))
        await pilot.pause()
        await pilot.click("#param-ttt_steps")
        await pilot.press("ctrl+a", "ctrl+k", "5")
        await pilot.click("#param-max_seq_len")
        await pilot.press("ctrl+a", "ctrl+k", *max_seq_len)
        pilot.app.screen.query_one("#keep").focus()  # no blinking text cursor in the picture
        await pilot.pause()
        while not pilot.app.screen.cost_is_current:  # predicted in a worker thread
            await pilot.pause(0.05)
    return run_before


def test_edit_form(snap_compare):
    assert snap_compare(make_app(), terminal_size=SIZE, run_before=edit_to("16384"))


def test_edit_form_names_the_checkpointing_a_step_too_long_needs(snap_compare):
    assert snap_compare(make_app(), terminal_size=SIZE, run_before=edit_to("98304"))


def test_kill_report_with_a_straggler(snap_compare):
    from backends.gpu import GpuProcess
    from backends.kill import GpuDelta, KillReport
    from tui.screens.kill import KillReportScreen

    report = KillReport(
        target="20261129-0930-a1b2", session="dflash", run_id="20261129-0930-a1b2",
        signalled=[4200, 4201, *range(4242, 4250)], killed=[4247], survivors=[],
        gpus=[GpuDelta(i, 40960 + 512 * i, 76800 if i == 3 else 0) for i in range(8)],
        gpu_processes_before=[], stragglers=[GpuProcess(4245, 3, 76800, "python3")],
        other_holders=[GpuProcess(999, 7, 1024, "jupyter")], released=False, gpu_status="OK",
        gpu_message="", exit_status=0, seconds=31.2, release_s=None,
    )  # fmt: skip

    async def run_before(pilot) -> None:
        await on_run(pilot)
        pilot.app.push_screen(KillReportScreen(RUN_KEY, report))
        await pilot.pause()

    assert snap_compare(make_app(), terminal_size=SIZE, run_before=run_before)


def test_fleet_with_a_run_spanning_two_hosts(snap_compare):
    """Listed once, under its first node's host, each node's state on a row of its own."""
    assert snap_compare(make_multinode_app(), terminal_size=SIZE, run_before=feed_multinode)


async def on_multinode_run(pilot) -> None:
    await feed_multinode(pilot)
    pilot.app.open_run(MULTI_KEY)
    await pilot.pause()


def test_run_spanning_two_hosts(snap_compare):
    """Both hosts' GPUs, its nodes and every rank's peak."""
    assert snap_compare(make_multinode_app(), terminal_size=SIZE, run_before=on_multinode_run)


def test_kill_modal_of_a_run_spanning_two_hosts(snap_compare):
    """Every node's PIDs and ranks, each on its own host."""

    async def run_before(pilot) -> None:
        await on_multinode_run(pilot)
        pilot.app.push_screen(KillConfirm(MULTI_KEY, multinode_plan()))
        await pilot.pause()

    assert snap_compare(make_multinode_app(), terminal_size=SIZE, run_before=run_before)


def open_edit(pilot):
    app = pilot.app
    run = app.runs[RUN_KEY]
    app.push_screen(EditScreen(run, app.hosts[run.host], {}))


@pytest.mark.parametrize("size", [(80, 24), (120, 36)])
async def test_the_edit_form_keeps_its_title_and_buttons_in_sight(size):
    """A default terminal: the fields scroll between the title and Cancel/Keep (Keep was
    out of sight at 80×24 and 120×36, and Tab focused it unseen)."""
    from tests.tui.conftest import screen_text, wait_for

    app = make_app()
    async with app.run_test(size=size) as pilot:
        await on_run(pilot)
        open_edit(pilot)
        shown = lambda: screen_text(app)  # noqa: E731
        await wait_for(pilot, lambda: "Keep (r relaunches)" in shown() and "Cancel" in shown(), 10, "Cancel and Keep on screen")
        assert "Edit h200-box/" in shown()


def test_edit_form_at_80x24(snap_compare):
    async def run_before(pilot) -> None:
        await on_run(pilot)
        pilot.app.clear_notifications()  # the alerts' toasts, which cover a small screen's corner
        open_edit(pilot)
        await pilot.pause(0.5)
        pilot.app.screen.query_one("#keep").focus()
        await pilot.pause(0.5)

    assert snap_compare(make_app(), terminal_size=(80, 24), run_before=run_before)
