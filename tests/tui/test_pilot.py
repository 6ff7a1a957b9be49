"""The dashboard driven by keys against this machine and real tmux, with the real trainer.

launch → metrics appear → k + confirm → run gone, verification shown → e, change TTT →
r → a new run with the new TTT trains.
"""

from __future__ import annotations

import pytest

from backends import kill, tmux
from tests.tui.conftest import TRAIN, demo_run, screen_text, wait_for
from tests.waiting import HANG_S, trainer_started
from tui.app import Demo, TracksideApp, Watched
from tui.screens.edit import EditScreen
from tui.screens.kill import KillConfirm, KillReportScreen
from tui.screens.run import RunScreen

GRACE_S = 20
PARAMS = {"max_seq_len": 256, "ttt_steps": 2, "steps": 100000, "save_every": 100000}


@pytest.mark.slow
@pytest.mark.timeout(600)  # two trainer starts, each bounded by HANG_S: a slow start fails on its own message
async def test_launch_kill_edit_relaunch(local_host):
    from backends import params as run_params

    demo = Demo(run_params.apply(TRAIN, PARAMS), "tui-pilot", dict(PARAMS))
    app = TracksideApp([Watched(local_host, smi="nvidia-smi-absent")], demo=demo, grace_s=GRACE_S)
    async with app.run_test(size=(160, 48)) as pilot:
        screen = await wait_for(pilot, lambda: isinstance(app.screen, RunScreen) and app.screen.is_mounted and app.screen, 10, "the run screen")
        first = await demo_run(pilot, screen)
        await wait_for(pilot, lambda: trainer_started(first.info.run_dir), HANG_S, "the demo run's start event")
        await wait_for(pilot, lambda: len(first.steps) >= 2, 90, "step events")
        assert first.loss is not None
        assert "no GPU on this machine" in screen_text(app)

        await pilot.press("k")
        confirm = await wait_for(pilot, lambda: isinstance(app.screen, KillConfirm) and app.screen.is_mounted and app.screen, 10, "the kill modal")
        assert "tui-pilot" in str(confirm.query_one("#kill-plan").render())
        assert confirm.plan.pids and set(first.info.pids) <= set(confirm.plan.pids)
        await wait_for(pilot, lambda: getattr(app.focused, "id", None) == "no", 5, "No focused: the default answer")
        await pilot.press("y")
        # As long as kill_run may take: the grace, SIGKILL's wait, then the GPU check (10 s
        # by default) beside the pane's exit status, then the wait for the stopped trainer's
        # checkpoint to be durable (its writer's fsyncs, slow on a loaded disk). Alone it
        # takes a few seconds; in a loaded full suite it took over 40 twice.
        bound = GRACE_S + kill.KILL_WAIT_S + max(10, kill.PANE_EXIT_WAIT_S) + kill.DURABLE_WAIT_S
        report = await wait_for(pilot, lambda: isinstance(app.screen, KillReportScreen) and app.screen.is_mounted and app.screen, bound, "the kill report")
        assert set(confirm.plan.pids) <= set(report.report.signalled)
        assert not report.report.survivors
        await wait_for(pilot, lambda: "GPU memory before → after" in screen_text(app), 5, "the report drawn")
        assert "tui-pilot" not in await tmux.list_sessions(local_host)
        await pilot.press("escape")
        await wait_for(pilot, lambda: first.state_label != "running", 10, "the run to read as stopped")

        await pilot.press("e")
        form = await wait_for(pilot, lambda: isinstance(app.screen, EditScreen) and app.screen.is_mounted and app.screen, 5, "the edit form")
        form.query_one("#param-ttt_steps").value = "3"
        await pilot.pause()
        assert form.changes == {"ttt_steps": 3}
        assert "ttt_steps: 2 → 3" in screen_text(app)
        await pilot.click("#keep")
        await wait_for(
            pilot, lambda: app.pending.get(first.key) == {"ttt_steps": 3}, 15,
            "the edit to be kept",
        )  # fmt: skip

        await pilot.press("r")
        second = await wait_for(
            pilot, lambda: screen.run_key != first.key and screen.run, 30, "the relaunched run on screen"
        )
        assert second.info.parent == first.info.run_id
        await wait_for(pilot, lambda: second.start is not None, HANG_S, "the new run's start event")
        assert second.start["config"]["ttt_steps"] == 3
        await wait_for(pilot, lambda: second.steps, 60, "the new run to train")
        assert len(second.steps[-1]["loss_ttt"]) == 3

        await pilot.press("R")
        confirm = await wait_for(pilot, lambda: isinstance(app.screen, KillConfirm) and app.screen.is_mounted and app.screen, 10, "R's kill modal")
        assert "Then relaunch with unchanged parameters" in str(confirm.query_one("#kill-plan").render())
        await pilot.press("y")
        third = await wait_for(
            pilot, lambda: screen.run_key not in (first.key, second.key) and screen.run, 60, "the kill-and-relaunched run"
        )
        assert third.info.parent == second.info.run_id and third.params["ttt_steps"] == 3
        # The session the demo named passes from run to run, held by the newest alone.
        assert second.info.session == third.info.session == "tui-pilot"
        assert [p.pid for p in await tmux.list_panes(local_host, "tui-pilot")] == third.info.pids


async def test_a_session_trackside_did_not_launch_shows_its_console_loss(local_host, tmux_socket):
    import subprocess

    script = "i=0; while true; do i=$((i+1)); echo \"{'loss': $((1000 - i)).5, 'epoch': 0.$i}\"; sleep 0.2; done"
    subprocess.run(["tmux", "-L", tmux_socket, "new-session", "-d", "-s", "theirs", "sh", "-c", script], check=True)
    app = TracksideApp([Watched(local_host, smi="nvidia-smi-absent")])
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: "local/theirs" in app.runs, 15, "the foreign session in the fleet")
        assert "theirs" in screen_text(app)
        app.open_run("local/theirs")
        run = app.runs["local/theirs"]
        await wait_for(pilot, lambda: len(run.console_loss) >= 3, 15, "losses read from the pane")
        losses = [loss for _, loss in run.console_loss]
        assert losses == sorted(losses, reverse=True) and len(set(losses)) == len(losses)  # none twice
        # 999.5 falling: 9xx.5 for the test's whole life
        await wait_for(pilot, lambda: "loss 9" in screen_text(app), 10, "its loss on its screen")
