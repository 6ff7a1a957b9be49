"""`trackside replay` on real runs at 80×24, beside the real recorder (backends/recorder)
reading the test nvidia-smi stand-in (tests/fake_nvidia_smi.py: this machine has no GPU):
a CPU training stopped by a kill and relaunched, the recorder killed and restarted while it
trained, and a session trackside did not launch; each read back from its run dir, pane
recording and the host's recording at moments of its past; `--at` outside a run's life; the
run screen's `g`, its life by time.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from textual.widgets import Static

from backends import kill, runs
from backends.config import load_config
from backends.history import moments_of
from backends.history.read import read_history
from backends.logs import panes
from backends.recorder.read import read_recording
from backends.recorder.start import session_of
from backends.relaunch import Relaunch, relaunch
from scripts.local_box import end_tmux_server
from tests.tui.conftest import screen_text, wait_for
from tests.tui.test_newcomer import TRACKSIDE, tmux
from tests.waiting import HANG_S, niced, until
from tui.app import TracksideApp, Watched
from tui.cli import main
from tui.messages import RunsListed
from tui.replay import ReplayApp
from tui.state import format_number
from tui.screens.pick_moment import PickMoment
from tui.screens.replay import SAME_S, ReplayScreen
from tui.widgets.gpu_life import GpuLife
from tui.widgets.gpu_panel import GpuRow

SIZE = (80, 24)
FAKE_SMI = Path(__file__).resolve().parents[1] / "fake_nvidia_smi.py"
TRAIN = niced([sys.executable, "-m", "training", "train", "--synthetic", "--max-seq-len", "128", "--ttt-steps", "2"])
# Someone else's program: it prints a loss a step, then waits in its pane.
FOREIGN = [sys.executable, "-c", "import time\nfor s in range(1, 41): print(f'step {s} loss={5 - s / 10:.2f}', flush=True); time.sleep(0.5)\ntime.sleep(600)"]


@dataclass
class Past:
    root: str
    config: Path
    run: runs.RunInfo  # killed after some steps, then relaunched
    child: runs.RunInfo
    down: tuple[float, float]  # the recorder killed, and started again


def _log_sizes(rec, path: str) -> list:
    return [s for s in rec.logs if s.path == path and s.size > 0]


async def _steps(run_dir: str) -> int:
    try:
        return Path(run_dir, "metrics.jsonl").read_text().count('"event": "step"')
    except FileNotFoundError:
        return 0


async def _until(what: str, check, timeout: float = HANG_S) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.3)


async def _make_past(config: Path, root: str) -> tuple[runs.RunInfo, runs.RunInfo, tuple[float, float]]:
    host = load_config(str(config)).hosts[0].make_host()
    began = time.time()
    run = await runs.launch(host, [*TRAIN, "--steps", "100000"])  # the first command: the recorder starts
    log = f"{run.run_id}/console.log"

    async def sizes() -> int:
        return len({s.size for s in _log_sizes(await read_recording(host, began), log)})

    def more(count: int):
        async def check() -> bool:
            return await sizes() >= count
        return check

    async def stepped() -> bool:
        return await _steps(run.run_dir) >= 20

    await _until("the recorder's first size of the run's log", more(1))
    # The recorder ticking (however long its start took on a loaded machine): someone
    # else's program starts, recorded from its first line on.
    subprocess.run(["tmux", "new-session", "-d", "-s", "their-sft", "--", *FOREIGN], check=True)
    await panes.read_session(host, "their-sft")
    await _until("the run's steps", stepped)
    await _until("two sizes of the log with steps in it", more(await sizes() + 2))
    subprocess.run(["tmux", "kill-session", "-t", f"={session_of(root)}"], check=True)
    killed = time.time()
    await asyncio.sleep(20)  # the run trains on, unrecorded: longer than the reader's gap
    again = load_config(str(config)).hosts[0].make_host()
    await runs.list_runs(again)  # its first command: the recorder starts again
    restarted = time.time()

    async def sampled() -> bool:
        return any(g.time > restarted for g in (await read_recording(host, began)).gpus)

    await _until("the restarted recorder's samples", sampled)
    await _until("a size of the log after the restart", more(await sizes() + 1))
    await kill.kill_run(host, run.run_id, grace_s=30)
    child, _ = await relaunch(Relaunch(host.name, run.run_id, {"steps": 5}), {host.name: host})
    await asyncio.sleep(6)  # a tick of the recorder past the stop
    await asyncio.gather(host.close(), again.close())
    return run, child, (killed, restarted)


@pytest.fixture(scope="module")
def past(tmp_path_factory):
    tmux_dir = tempfile.mkdtemp(prefix="ts-replay-", dir="/tmp")
    base = tmp_path_factory.mktemp("replay")
    root = str(base / "runs")
    smi = base / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nFAKE_NVIDIA_SMI_GPUS=2 FAKE_NVIDIA_SMI_STATE=load exec {sys.executable} -S {FAKE_SMI} \"$@\"\n")
    smi.chmod(0o755)
    config = base / "config.toml"
    config.write_text(f'[hosts.box]\nruns_root = "{root}"\nnvidia_smi = "{smi}"\n')
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TMUX_TMPDIR", tmux_dir)
        env.delenv("TMUX", raising=False)
        try:
            run, child, down = asyncio.run(_make_past(config, root))
            yield Past(root, config, run, child, down)
        finally:
            end_tmux_server("tmux")  # the module's server: the runs, the recorder
            shutil.rmtree(tmux_dir, ignore_errors=True)


async def history_of(past: Past, target: str):
    host = load_config(str(past.config)).hosts[0].make_host()
    host.on_reach = None  # read what was recorded, start nothing
    try:
        return await read_history(host, target)
    finally:
        await host.close()


async def test_the_moments_of_a_stopped_and_relaunched_run(past):
    history = await history_of(past, past.run.run_id)
    kinds = [m.kind for m in moments_of(history)]
    assert {"start", "stop", "relaunch", "gap"} <= set(kinds), kinds
    # the recorder's gap while it was killed (and the one before its first sample, from the run's start)
    assert [m for m in moments_of(history) if m.kind == "gap" and past.down[0] - 6 < m.time < past.down[1]]
    said = {m.kind: m.text for m in moments_of(history)}
    assert said["stop"] == "SIGTERM sent by a kill"
    assert said["relaunch"] == f"relaunched as {past.child.run_id}"
    assert said["end"] == "trainer ended: stopped"


async def test_replay_at_80x24_shows_the_run_as_it_was_then_and_steps_through_time(past):
    history = await history_of(past, past.run.run_id)
    gap = next(m for m in moments_of(history) if m.kind == "gap" and past.down[0] - 6 < m.time < past.down[1])
    # the recorder's last size of the log strictly before its gap began (a tick writes both at
    # one time, so the last size can be the gap's start itself): steps were made by then
    sized = [s for s in _log_sizes(history.recording, f"{past.run.run_id}/console.log") if s.time < gap.time - SAME_S]
    when = sized[-1].time
    count = sum(1 for e in history.events if e["event"] == "step" and e["time"] <= when)
    assert count > 0
    log = Path(past.root, past.run.run_id, "console.log").read_bytes()
    then = log[: sized[-1].size].decode(errors="replace").rstrip("\n").splitlines()
    later = log[sized[-1].size :].decode(errors="replace").splitlines()
    app = ReplayApp(history, moments_of(history), when)
    async with app.run_test(size=SIZE) as pilot:
        shown = lambda: screen_text(app)  # noqa: E731
        stats = lambda: str(app.screen.query_one("#stats", Static).render())  # noqa: E731
        await wait_for(pilot, lambda: f"step {format_number(count)} " in stats(), 20, f"the stats at step {count}")
        text = shown()
        assert "read-only: no key acts on the run" in text
        assert "GPU0" in text  # the cards as recorded then (their figures past the 80 columns' cut)
        assert "/700 W" in app.screen.query_one(GpuRow).shown.plain
        assert then[-1].strip()[:40] in text  # the log's last line then…
        assert not any(line.strip() and line.strip()[:40] in text for line in later if "step=" in line)  # …and none after
        assert "loss (" in text and "┤" in text  # the curve up to then
        # n, moment by moment, to the recorder's gap, said, not filled (a loaded machine's
        # run may have stalled, or its GPUs gone under-fed, before it)
        for following in [m for m in app.moments if when + SAME_S < m.time <= gap.time]:
            await pilot.press("n")
            await wait_for(pilot, lambda: app.screen.when == following.time and "[now]" in shown(), 10, f"{following} (of {app.moments})")
        assert "recorder down for" in shown()
        await pilot.press("full_stop")  # a step the run made while the recorder was down
        await wait_for(pilot, lambda: app.screen.query("#gpu-none-0"), 10, "the GPU panel inside the gap")
        assert "GPUs on box: the recorder was down here" in str(app.screen.query_one("#gpu-none-0", Static).render())
        # n, moment by moment, to the kill's SIGTERM (the relaunch's, dated to its second, may come first)
        for following in [m for m in app.moments if m.time > app.screen.when][:3]:
            await pilot.press("n")
            await wait_for(pilot, lambda: app.screen.when == following.time and "[now]" in shown(), 10, f"{following} (of {app.moments})")
            if following.kind == "stop":
                break
        assert "SIGTERM sent by a kill" in shown()
        assert "/700 W" in app.screen.query_one(GpuRow).shown.plain  # recorded again by then
        await pilot.press("k", "e", "r", "R")  # no key acts on the run: none of the dashboard's
        assert app.is_running and app.screen.query_one("#when")
        await pilot.press("home")
        await wait_for(pilot, lambda: " +0s/" in shown(), 10, "the run's start")
        await pilot.press("full_stop")  # its first step
        await wait_for(pilot, lambda: "step 1 " in stats(), 10, "step 1")
        await pilot.press("end")
        await wait_for(pilot, lambda: "ended" in shown(), 10, "the run's end")
        await pilot.press("m")  # every moment, the one here highlighted: the one before it, Enter
        await wait_for(pilot, lambda: isinstance(app.screen, PickMoment), 10, "the moments' list")
        before = [m for m in app.moments if m.time <= history.end][-2]
        await pilot.press("up", "enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ReplayScreen) and app.screen.when == before.time, 10, f"{before}")


async def test_the_run_screens_g_shows_its_life_by_time_with_the_recorders_gap_blank(past):
    host = load_config(str(past.config)).hosts[0].make_host()
    host.on_reach = None
    info = next(r for r in await runs.list_runs(host) if r.run_id == past.run.run_id)
    app = TracksideApp([Watched(host)], monitor=False)
    async with app.run_test(size=SIZE) as pilot:
        app.post_message(RunsListed("box", [info], time.time()))
        await pilot.pause()
        app.open_run(f"box/{past.run.run_id}")
        await pilot.pause()
        await pilot.press("g")
        life = app.screen.query_one(GpuLife)
        await wait_for(pilot, lambda: life.recording is not None, 30, "the recording, read by the screen's worker")
        text = screen_text(app)
        assert "loss by time" in text and "power W of 1400 (2 GPUs of the host, summed" in text, text
        shown = life.render().plain.splitlines()
        power = [line for line in shown if "┤" in line or "│" in line][-4:]  # the power and memory bands' rows
        assert any("  " in line.split("┤")[-1].split("│")[-1].strip() for line in power), shown  # the gap, blank
        await pilot.press("g")
        await wait_for(pilot, lambda: not life.display and "loss (" in screen_text(app), 10, "the loss chart back")
    await host.close()


async def test_replay_of_a_session_trackside_did_not_launch_from_its_pane_recording(past):
    history = await history_of(past, "their-sft")
    assert history.run_id is None and history.tape is not None and history.tape.recorded
    middle = next(s.time for s in history.recording.logs if s.path == history.tape.path and s.size > 60)
    app = ReplayApp(history, moments_of(history), middle)
    async with app.run_test(size=SIZE) as pilot:
        shown = lambda: screen_text(app)  # noqa: E731
        await wait_for(pilot, lambda: "their-sft" in shown() and "step " in shown(), 20, "the session's fold")
        first = app.screen.frame.console.step
        assert first is not None and first < 40
        await pilot.press("end")
        await wait_for(pilot, lambda: app.screen.frame.console.step == 40, 10, "its last step at its end")
        assert "step 40 loss=1.00" in shown()


async def test_a_past_read_over_ssh_is_the_one_read_here(past, sshd):
    """The test sshd on 127.0.0.1 reaches the same runs root: the run, its log, its recording
    and its moments read alike through an SSH host."""
    if not sshd.running:
        sshd.start()
    here = await history_of(past, past.run.run_id)
    remote = sshd.host(runs_root=past.root)
    try:
        there = await read_history(remote, past.run.run_id)
    finally:
        await remote.close()
    assert there.events == here.events and there.tape.data == here.tape.data
    assert there.tape.offsets == here.tape.offsets and there.stops == here.stops and there.relaunches == here.relaunches
    assert [g for g in there.recording.gpus if g.time <= here.end] == [g for g in here.recording.gpus if g.time <= here.end]
    assert [m for m in moments_of(there) if m.time < here.end - 1] == [m for m in moments_of(here) if m.time < here.end - 1]


def test_at_outside_the_runs_life_is_a_usage_error_naming_it_and_replay_starts_no_recorder(past, capsys):
    recorder = session_of(past.root)
    subprocess.run(["tmux", "kill-session", "-t", f"={recorder}"], check=True)
    for at, said in (("-99h", "before the run's start"), ("+99h", "after the run's end"), ("soon", "expected +DURATION")):
        code = main(["replay", past.run.run_id, "--config", str(past.config), "--at", at])
        err = capsys.readouterr().err
        assert code == 2 and said in err and "Traceback" not in err, err
        assert err.startswith(f"trackside replay: reading {past.run.run_id} on "), err  # said before the read
    code = main(["replay", "20990101-0000-0000", "--config", str(past.config)])
    assert code == 1 and "no run 20990101-0000-0000" in capsys.readouterr().err
    # read-only: the host's recording is read, never appended to (a recording brought back from a GPU box)
    assert subprocess.run(["tmux", "has-session", "-t", f"={recorder}"], capture_output=True).returncode != 0
    # nor does it record a pane it meets, as a listing would: a bystander's session stays unrecorded
    subprocess.run(["tmux", "new-session", "-d", "-s", "bystander", "sleep", "600"], check=True)
    assert main(["replay", past.run.run_id, "--config", str(past.config), "--at", "-99h"]) == 2
    assert not list(Path(past.root, "panes").glob("*/bystander-*")), "replay recorded a pane"


async def test_replay_in_a_terminal_says_what_it_reads_before_its_screen_opens(past, tmux_socket):
    steps = sum(e["event"] == "step" for e in (await history_of(past, past.run.run_id)).events)
    command = f"{TRACKSIDE} replay {past.run.run_id} --config {past.config}; echo replay exited $?; exec sleep 600"
    tmux(tmux_socket, "-f", "/dev/null", "new-session", "-d", "-s", "replay", "-x", "100", "-y", "30", command)
    screen = lambda: tmux(tmux_socket, "capture-pane", "-p", "-t", "=replay:")  # noqa: E731
    until(lambda: "read-only" in screen(), HANG_S, "the replay's screen")
    tmux(tmux_socket, "send-keys", "-t", "=replay:", "q")
    said = until(lambda: "replay exited 0" in (text := screen()) and text, 30, "the replay's exit")
    assert f"trackside replay: reading {past.run.run_id} on box…" in said, said
    assert f"trackside replay: finding the moments that mattered in {steps:,} steps…" in said, said
