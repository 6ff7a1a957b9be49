"""Snapshots of the screens and dialogs, from fixed data posted as monitor messages and a frozen clock.

Regenerate after an intended change with `pytest tests/tui/test_snapshots.py --snapshot-update`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import pytest
from textual.widgets import Button

from backends.alerts import Alert, Entry
from backends.gpu import GpuProcess
from backends.kill import GpuDelta, KillReport
from backends.runs import RunPhase
from tests.tui.conftest import screen_text, wait_for
from tests.waiting import HANG_S
from tui.app import TracksideApp
from tui.messages import RunsListed
from scripts.sample import (
    FOREIGN_KEY, MULTI_KEY, NOW, RUN_KEY, feed, feed_foreign, feed_multinode, kill_plan, make_app, make_multinode_app,
    multinode_plan, on_dflash_run, on_run, run_info,
)  # fmt: skip
from tui.screens.edit import EditScreen
from tui.screens.kill import KillConfirm, KillReportScreen, relaunch_question

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
    assert snap_compare(make_app(), terminal_size=SIZE, run_before=DIALOGS["kill"].opened)


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


def straggler_report() -> KillReport:
    """A kill whose rank on GPU 3 outlived SIGKILL, a bystander's notebook left alone."""
    return KillReport(
        target="20261129-0930-a1b2", session="eagle3-8k", run_id="20261129-0930-a1b2",
        signalled=[4200, 4201, *range(4242, 4250)], killed=[4247], survivors=[],
        gpus=[GpuDelta(i, 40960 + 512 * i, 76800 if i == 3 else 0) for i in range(8)],
        gpu_processes_before=[], stragglers=[GpuProcess(4245, 3, 76800, "python3")],
        other_holders=[GpuProcess(999, 7, 1024, "jupyter")], released=False, gpu_status="OK",
        gpu_message="", exit_status=0, seconds=31.2, release_s=None,
    )  # fmt: skip


def test_kill_report_with_a_straggler(snap_compare):
    assert snap_compare(make_app(), terminal_size=SIZE, run_before=DIALOGS["kill-report"].opened)


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
    assert snap_compare(make_multinode_app(), terminal_size=SIZE, run_before=DIALOGS["kill-two-hosts"].opened)


def open_edit(pilot):
    app = pilot.app
    run = app.runs[RUN_KEY]
    app.push_screen(EditScreen(run, app.hosts[run.host], {}))


@pytest.mark.parametrize("size", [(80, 24), (120, 36)])
async def test_the_edit_form_keeps_its_title_and_buttons_in_sight(size):
    """A default terminal: the fields scroll between the title and Cancel/Keep (Keep was
    out of sight at 80×24 and 120×36, and Tab focused it unseen)."""
    app = make_app()
    async with app.run_test(size=size) as pilot:
        await on_run(pilot)
        open_edit(pilot)
        shown = lambda: screen_text(app)  # noqa: E731
        await wait_for(pilot, lambda: "Keep (r relaunches)" in shown() and "Cancel" in shown(), HANG_S, "Cancel and Keep on screen")
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


# Every dialog at a default terminal (issue 32, item 8): its title and its answers (the
# buttons, or the line that says how it closes) stay in sight, what does not fit scrolls
# between them, and Tab never focuses what cannot be seen.

SWEEP = 30  # earlier runs of a sweep, ended: more than a picker at 120×36 can show at once
FLAPS = 30  # times a host was lost and came back: more alerts than a screen of 120×36 holds


def sweep_run(index: int):
    return dataclasses.replace(
        run_info(RunPhase.EXITED), run_id=f"20261128-{index:02d}00-sw{index:02d}", exit_status=0,
        params={**run_info().params, "lr": round(1e-4 * (index + 1), 4)}, started=f"2026-11-28T{index % 24:02d}:00:00Z",
    )  # fmt: skip


async def on_run_after_a_sweep(pilot) -> None:
    await on_run(pilot)
    pilot.app.post_message(RunsListed("h200-box", [run_info(), *(sweep_run(i) for i in range(SWEEP))], NOW))
    await pilot.pause()


async def on_run_after_a_night_of_alerts(pilot) -> None:
    """A host that came and went all night, the oldest alert a run that failed before it."""
    entries = pilot.app.alert_book.entries
    failed = "h200-box/20261128-2200-0f0f"
    entries.append(Entry(Alert(f"failed:{failed}", f"{failed} failed: exit status 1", "error"), NOW - 9000))
    for flap in range(FLAPS):
        raised = NOW - 8000 + 240 * flap
        entries.append(Entry(Alert("lost:pve-129", "pve-129 lost: connection refused by 10.0.0.129:22", "error"), raised, raised + 60))
    await on_run(pilot)


def pushing(make_dialog):
    async def open_dialog(pilot) -> None:
        pilot.app.push_screen(make_dialog())

    return open_dialog


def pressing(key: str):
    async def open_dialog(pilot) -> None:
        await pilot.press(key)

    return open_dialog


@dataclass(frozen=True)
class Shown:
    """A dialog opened on the sample fleet, and what must be seen of it."""

    fleet: Callable[..., Awaitable[None]]  # the fleet as the dialog finds it
    open: Callable[..., Awaitable[None]]
    title: str
    answers: tuple[str, ...]  # in sight with its buttons: what they say, or the line saying how it closes
    last: str  # the end of what it says, reached by scrolling
    app: Callable[[], TracksideApp] = make_app

    async def opened(self, pilot, *, quiet: bool = False) -> None:
        await self.fleet(pilot)
        if quiet:  # the alerts' toasts, which cover a small screen's corner (cleared before
            pilot.app.clear_notifications()  # the dialog: clearing clears only the top screen's)
        await self.open(pilot)
        await pilot.pause()


DIALOGS = {
    "kill": Shown(
        on_run, pushing(lambda: KillConfirm(RUN_KEY, kill_plan())), f"Stop run {RUN_KEY} on h200-box?", ("Yes, kill",),
        "Nothing else on the host is touched.",
    ),
    "kill-two-hosts": Shown(
        on_multinode_run, pushing(lambda: KillConfirm(MULTI_KEY, multinode_plan())),
        f"Stop run {MULTI_KEY} on h200-a+h200-b?", ("Yes, kill",), "Nothing else on these hosts is touched.",
        make_multinode_app,
    ),
    "kill-report": Shown(
        on_run, pushing(lambda: KillReportScreen(RUN_KEY, straggler_report())), f"Killed {RUN_KEY} in 31.2s", ("Close",),
        "NOT released",
    ),
    "relaunch-question": Shown(
        on_run, pushing(lambda: relaunch_question(RUN_KEY, kill_plan())), f"Relaunch while {RUN_KEY} still runs?",
        ("Yes, run both",), "R stops it first",
    ),
    "overlay-picker": Shown(
        on_run_after_a_sweep, pressing("o"), f"Draw which run's loss behind {RUN_KEY}?", (), sweep_run(SWEEP - 1).run_id
    ),
    "help": Shown(on_run, pressing("question_mark"), "Keys", ("Esc or ? closes",), "Every action by name"),
    "alerts": Shown(
        on_run_after_a_night_of_alerts, pressing("exclamation_mark"), "Alerts", ("Esc or ! closes",),
        "20261128-2200-0f0f failed",
    ),
}  # fmt: skip


def in_sight(app, widget) -> bool:
    """Whether all of `widget` is drawn: not scrolled away, not cut off by the screen's edge."""
    placed = app.screen._compositor.visible_widgets.get(widget)
    return placed is not None and placed[1].contains_region(placed[0])


@pytest.mark.parametrize("size", [(80, 24), (120, 36)])
@pytest.mark.parametrize("name", DIALOGS)
async def test_every_dialog_keeps_its_title_and_answers_in_sight(name, size):
    """Tabbed round, what each focus scrolls scrolled to its end: the title and answers never
    leave the screen, nothing focused is out of sight, and the last of what it says is read."""
    shown = DIALOGS[name]
    app = shown.app()
    async with app.run_test(size=size) as pilot:
        await shown.opened(pilot)
        dialog = app.screen

        def text() -> str:
            return screen_text(app)

        seen = (shown.title, *shown.answers)
        buttons = list(dialog.query(Button))
        await wait_for(pilot, lambda: all(s in text() for s in seen), 5, f"{seen} on screen")
        assert all(in_sight(app, button) for button in buttons), text()
        for _ in range(len(dialog.focus_chain) or 1):
            focused = app.focused
            if focused is not None:
                assert in_sight(app, focused), f"{focused} focused out of sight"
                if focused.allow_vertical_scroll:
                    await pilot.press("end")
            await pilot.press("tab")
            await pilot.pause()
        assert app.screen is dialog
        assert shown.last in text() and all(s in text() for s in seen), text()
        assert all(in_sight(app, button) for button in buttons), text()


@pytest.fixture
def utc(monkeypatch):
    """The alerts' clock times read the same on every machine."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.parametrize("name", DIALOGS)
def test_dialog_at_80x24(name, snap_compare, utc):
    shown = DIALOGS[name]

    async def run_before(pilot) -> None:
        await shown.opened(pilot, quiet=True)
        await pilot.pause(0.5)

    assert snap_compare(shown.app(), terminal_size=(80, 24), run_before=run_before)


@pytest.mark.parametrize("at", [600.0, 430.0])
def test_replay_at_80x24(at, snap_compare, utc):
    """A moment of the sample run's past: its GPUs then, the loss and the log up to then,
    the moments on its time line; and one inside the recorder's gap, said, not filled."""
    from backends.history import moments_of
    from scripts.sample import T0, replay_history
    from tui.replay import ReplayApp

    history = replay_history()

    async def run_before(pilot) -> None:
        await wait_for(pilot, lambda: "loss (" in screen_text(pilot.app), HANG_S, "the chart")
        await pilot.pause(0.6)  # the chart's replot

    assert snap_compare(ReplayApp(history, moments_of(history), T0 + at), terminal_size=(80, 24), run_before=run_before)
