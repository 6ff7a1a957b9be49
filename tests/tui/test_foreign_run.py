"""A tmux session trackside did not launch, printing as HF Trainer does, seen on the dashboard:
its step, progress and ETA from its bar, and its loss curve from the pane's scrollback,
then from what it prints next."""

from __future__ import annotations

import re
import subprocess
import sys

from backends import runs
from tests.tui.conftest import screen_text, wait_for
from tui.app import TracksideApp, Watched
from tui.widgets.loss_chart import LossChart

# 500 loss dicts (logged every 4 steps: more than a screen and its 200 lines above) above a
# bar at step 2000 of 10,000, as the scrollback holds them when the dashboard first sees the
# pane (the script waits for the file named by its argument); then a step every 0.3 s with a
# dict every other one, written as tqdm.write does: the bar cleared, the dict printed, the
# bar drawn again below it.
HF_TRAINER = r"""
import os, sys, time
for i in range(1, 501):
    print({"loss": round(3 - i / 250, 4), "grad_norm": 0.5, "learning_rate": 1e-05, "epoch": round(i / 250, 3)})
def bar(n):
    sys.stdout.write(f"\r{n * 100 // 10000:3d}%|██        | {n}/10000 [10:00<40:00,  3.33it/s]")
    sys.stdout.flush()
n = 2000
bar(n)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
while True:
    time.sleep(0.3)
    n += 5
    if n % 10 == 0:
        sys.stdout.write("\r\x1b[K" + str({"loss": round(3 - n / 1000, 4), "epoch": round(n / 1000, 3)}) + "\n")
    bar(n)
"""


async def test_a_foreign_run_shows_its_step_progress_and_curve_from_its_scrollback(local_host, tmux_socket, tmp_path):
    script, go = tmp_path / "hf_trainer.py", tmp_path / "go"
    script.write_text(HF_TRAINER)
    subprocess.run(["tmux", "-L", tmux_socket, "new-session", "-d", "-s", "hf", "-x", "120", "-y", "30", sys.executable, str(script), str(go)], check=True)
    app = TracksideApp([Watched(local_host, smi="nvidia-smi-absent")])
    async with app.run_test(size=(160, 48)) as pilot:
        run = await wait_for(pilot, lambda: app.runs.get("local/hf"), 15, "the foreign session in the fleet")
        await wait_for(pilot, lambda: run.info.last_step, 15, "the listing to read its pane")
        assert run.info.last_step == 2000 and run.info.progress.total == 10000
        go.touch()  # recorded from here on
        await wait_for(pilot, lambda: "/10000" in screen_text(app), 5, "its progress on the fleet")

        app.open_run("local/hf")
        await wait_for(pilot, lambda: len(run.console_loss) >= 500, 15, "the losses in its scrollback")
        await wait_for(pilot, lambda: len(run.console_loss) >= 503, 15, "losses printed since")
        steps = [step for step, _ in run.console_loss]
        assert steps[:2] == [4, 8] and steps == sorted(set(steps))  # spread by the bar, none twice
        losses = [loss for _, loss in run.console_loss]
        assert losses == sorted(losses, reverse=True)

        chart = app.screen.query_one(LossChart)
        await wait_for(pilot, lambda: len(chart.curves.steps) >= 503, 5, "the chart to draw them")
        shown = screen_text(app)
        assert re.search(r"step 20\d\d\b", shown), shown
        assert re.search(r"training: 20\d\d/10000 2[01]%, ETA 40m00s", shown), shown
        assert any(0x2800 < ord(c) <= 0x28FF for c in shown)  # the curve's braille dots
        assert "loss (smoothed over ~6 points, linear y)" in shown


def test_a_pane_capture_passes_on_each_line_once_and_a_redrawn_bar_once_per_redraw():
    from tui.monitor import pane_news

    assert pane_news([], ["a", "b", "bar 1"]) == ["a", "b", "bar 1"]
    assert pane_news(["a", "b", "bar 1"], ["a", "b", "bar 2"]) == ["bar 2"]  # redrawn in place
    assert pane_news(["a", "b", "bar 2"], ["a", "b", "loss 1", "bar 2"]) == ["loss 1"]  # printed above the bar
    assert pane_news(["a", "b"], ["a", "b", "c", "d"]) == ["c", "d"]  # plain scrolling
    assert pane_news(["x", "x", "x"], ["x", "x", "x", "x", "x"]) == ["x", "x"]  # repeats still counted
    assert pane_news(["a", "b"], ["a", "b"]) == []


# nanoGPT's training lines, one every 50 ms, for ever.
NANOGPT = r"""
import time
i = 0
while True:
    print(f"iter {i}: loss {3 - i / 10000:.4f}, time 50.00ms, mfu 1.00%", flush=True)
    i += 1
    time.sleep(0.05)
"""


async def test_a_foreign_row_keeps_moving_after_its_run_screen_was_opened_and_closed(local_host, tmux_socket, tmp_path):
    script = tmp_path / "nanogpt.py"
    script.write_text(NANOGPT)
    for name in ("gpt-a", "gpt-b"):
        subprocess.run(["tmux", "-L", tmux_socket, "new-session", "-d", "-s", name, "-x", "80", "-y", "24", sys.executable, str(script)], check=True)
    app = TracksideApp([Watched(local_host, smi="nvidia-smi-absent")], poll_interval=0.5)
    async with app.run_test(size=(120, 36)) as pilot:
        run = await wait_for(pilot, lambda: app.runs.get("local/gpt-a"), 15, "the session in the fleet")
        await wait_for(pilot, lambda: run.step, 15, "its first step")
        app.open_run("local/gpt-a")
        await wait_for(pilot, lambda: len(run.console_loss) > 20, 15, "its curve on its screen")
        await pilot.press("escape")
        await wait_for(pilot, lambda: len(app.screen_stack) == 2, 5, "the fleet again")
        closed_at = run.step
        await wait_for(pilot, lambda: run.step > closed_at + 40, 15, "its row to move on after its screen closed")
        # The row on screen says the step the run is at, not the one it was at when closed.
        await wait_for(pilot, lambda: str(run.step // 10) in screen_text(app), 5, "the step on its row")
        steps = [step for step, _ in run.console_loss]
        assert steps == sorted(set(steps)) and steps[-1] >= closed_at + 40  # its curve went on too, each step once
    # `trackside runs` reads the same record: every step printed since it was first seen.
    listed = {r.session: r for r in await runs.list_runs(local_host)}
    assert listed["gpt-a"].last_step > closed_at + 40 and listed["gpt-a"].pane == "0.0"
    assert listed["gpt-a"].console.curve[0][0] == 0  # from its first line (in the scrollback then)


async def test_a_foreign_session_stopped_with_k_reads_stopped_with_no_eta(local_host, tmux_socket, tmp_path):
    from tests.tui.test_operator_keys import kill_confirmed
    from tui.screens.fleet import run_cells

    script, go = tmp_path / "hf_trainer.py", tmp_path / "go"
    script.write_text(HF_TRAINER)
    go.touch()
    subprocess.run(["tmux", "-L", tmux_socket, "new-session", "-d", "-s", "hf", "-x", "80", "-y", "24", sys.executable, str(script), str(go)], check=True)
    app = TracksideApp([Watched(local_host, smi="nvidia-smi-absent")], poll_interval=0.5)
    async with app.run_test(size=(120, 36)) as pilot:
        run = await wait_for(pilot, lambda: app.runs.get("local/hf"), 15, "the foreign session in the fleet")
        await wait_for(pilot, lambda: run.eta_s() is not None, 15, "its ETA from its bar")
        app.open_run("local/hf")
        await pilot.pause()
        await kill_confirmed(pilot, "k")
        await wait_for(pilot, lambda: run.gone, 30, "the session to be gone")
        cells = run_cells(run, app.hosts["local"])
        assert (run.state_label, cells["state"].plain, cells["eta"]) == ("stopped", "stopped", "—")
        await pilot.press("escape")  # the kill's report: its run screen again, saying so
        await wait_for(pilot, lambda: "tmux session hf is gone" in screen_text(app), 10, "its run screen to say its session is gone")
        assert "ETA —" in screen_text(app) and "run directory" not in screen_text(app)
