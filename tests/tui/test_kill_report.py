"""The kill's dialogs at 80×24. After R → y: the kill report and its Close in sight, nothing over it saying what
it no longer says, the relaunch's word in it, and the session name the user gave kept
(issue 44: three toasts covered the report for ~8 s, one of them "checkpoint is being made
durable" over a report saying durable; the run came back as ts-…). r's question names
what keeps running from the kill's plan."""

from __future__ import annotations

import re
import time

from textual.widgets import Button
from textual.widgets._toast import Toast

from backends import kill, runs, tmux
from tests.tui.conftest import TRAIN, TRAINER, wait_for
from tests.tui.test_operator_keys import children, kill_confirmed, open_run_when
from tui.app import TracksideApp, Watched
from tui.screens.confirm import Confirm
from tui.screens.kill import KillConfirm, KillReportScreen


def overlaps(a, b) -> bool:
    return a.x < b.right and b.x < a.right and a.y < b.bottom and b.y < a.bottom


async def test_after_R_the_report_is_in_sight_with_its_relaunch_and_the_session_keeps_its_name(local_host):
    argv = [*TRAIN, "--steps", "100000", "--max-seq-len", "128", "--ttt-steps", "2", "--save-every", "0"]
    info = await runs.launch(local_host, argv, session="mytrain", train_command=TRAINER)
    app = TracksideApp([Watched(local_host, smi="nvidia-smi-absent", train_command=TRAINER)], poll_interval=0.2)
    key = f"local/{info.run_id}"
    async with app.run_test(size=(80, 24), notifications=True) as pilot:  # toasts drawn, as a terminal draws them
        await open_run_when(pilot, key, lambda run: run.steps, "the run's steps")
        await kill_confirmed(pilot, "R")
        report = await wait_for(pilot, lambda: isinstance(app.screen, KillReportScreen) and app.screen, 60, "the kill report")
        assert "durable" in report.report.times()  # the trainer saved on SIGTERM
        # For the toasts' life: Close in sight, no toast over the report, none of what it said.
        until = time.monotonic() + 6
        while time.monotonic() < until:
            await pilot.pause(0.2)
            close = report.query_one("#close", Button).region
            assert close.area and app.screen.region.contains_region(close)
            toasts = list(app.screen.query(Toast))
            assert not [str(t.render()) for t in toasts if overlaps(t.region, report.query_one(".dialog").region)]
        [child] = await wait_for(pilot, lambda: children(app, info), 60, "the relaunched run")
        said = await wait_for(pilot, lambda: report.relaunch and report.relaunch[0].startswith("relaunched as") and report.relaunch[0],
                              60, "the relaunch's word in the report")  # fmt: skip
        assert app.screen is report and child in said
        assert app.runs[child].info.session == "mytrain"
    assert [p.pid for p in await tmux.list_panes(local_host, "mytrain")] == app.runs[child].info.pids


async def test_r_on_a_live_run_names_the_processes_the_kill_dialog_names(local_host):
    """A real tmux run with child processes: r's question lists the same PIDs as k's plan
    (it listed the pane's shell alone, the kill dialog the whole tree)."""
    info = await runs.launch(local_host, ["sh", "-c", "sleep 300 & sleep 300 & wait"], startup_s=0)
    app = TracksideApp([Watched(local_host, smi="nvidia-smi-absent")], poll_interval=0.2)
    key = f"local/{info.run_id}"
    async with app.run_test(size=(80, 24)) as pilot:
        await open_run_when(pilot, key, lambda run: run.info.state is runs.RunPhase.RUNNING, "the run listed")
        await pilot.press("r")
        asked = await wait_for(pilot, lambda: isinstance(app.screen, Confirm) and app.screen, 15, "r's question")
        [listed] = re.findall(r"PIDs ([\d, ]+)\)", asked.question.plain)
        await pilot.press("escape")
        await pilot.press("k")
        dialog = await wait_for(pilot, lambda: isinstance(app.screen, KillConfirm) and app.screen, 15, "the kill dialog")
        await pilot.press("escape")
    assert [int(pid) for pid in listed.split(", ")] == list(dialog.plan.pids)
    assert len(dialog.plan.pids) == 4  # the pane's status-recording sh, the command's sh and its two sleeps
    await kill.kill_run(local_host, info.run_id, grace_s=5, nvml=False)
