"""`trackside replay` on real runs at 80×24: a CPU training stopped by a kill and relaunched,
and a session trackside did not launch, read back from their run dir and pane recording
at moments of their past; `--at` outside a run's life; keys that step through time.

The log's size over time is sampled here while the runs run, as the recorder samples it
(its LogSize rows), and the GPUs are the recorder's values for a card this machine lacks:
stand-ins named so, until the recorder's reader (backends/recorder/read.py) is merged.
"""

from __future__ import annotations

import asyncio
import os
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
from backends.history import moments_of
from backends.history.read import read_history, with_sizes
from backends.hosts import LocalHost
from backends.logs import panes
from backends.relaunch import Relaunch, relaunch
from scripts.local_box import end_tmux_server
from tests.backends.test_history import GpuSample, LogSize, Recording
from tests.tui.conftest import screen_text, wait_for
from tests.waiting import HANG_S, niced, trainer_started
from tui.cli import main
from tui.replay import ReplayApp
from tui.widgets.gpu_panel import GpuRow

SIZE = (80, 24)
TRAIN = niced([sys.executable, "-m", "training", "train", "--synthetic", "--max-seq-len", "128", "--ttt-steps", "2"])
# Someone else's program: it prints a loss a step, then waits in its pane.
FOREIGN = [sys.executable, "-c", "import time\nfor s in range(1, 41): print(f'step {s} loss={5 - s / 10:.2f}', flush=True); time.sleep(0.05)\ntime.sleep(600)"]


@dataclass
class Past:
    root: str
    config: Path
    run: runs.RunInfo  # killed after some steps, then relaunched
    child: runs.RunInfo
    sizes: list  # LogSize stand-ins: the logs' sizes as the recorder samples them


async def _sample(root: str, paths: list[str], into: list, stop: asyncio.Event) -> None:
    """Each log's size every 0.1 s, as (time, path relative to the runs root, size)."""
    while not stop.is_set():
        for path in paths:
            for found in Path(root).glob(path):
                into.append(LogSize(time.time(), str(found.relative_to(root)), found.stat().st_size))
        await asyncio.sleep(0.1)


async def _steps(run_dir: str) -> int:
    try:
        return Path(run_dir, "metrics.jsonl").read_text().count('"event": "step"')
    except FileNotFoundError:
        return 0


async def _make_past(host: LocalHost, root: str) -> tuple[runs.RunInfo, runs.RunInfo, list]:
    sizes: list = []
    stop = asyncio.Event()
    sampler = asyncio.create_task(_sample(root, ["*/console.log", "panes/*/*/*.log"], sizes, stop))
    try:
        run = await runs.launch(host, [*TRAIN, "--steps", "100000"])
        subprocess.run(["tmux", "new-session", "-d", "-s", "their-sft", "--", *FOREIGN], check=True)
        await panes.read_session(host, "their-sft")  # first seen: its pane recorded from here
        deadline = time.monotonic() + HANG_S
        while await _steps(run.run_dir) < 25:
            assert time.monotonic() < deadline, "the run never made its steps"
            await asyncio.sleep(0.2)
        await kill.kill_run(host, run.run_id, grace_s=30)
        child, _ = await relaunch(Relaunch(host.name, run.run_id, {"steps": 5}), {host.name: host})
        await asyncio.sleep(0.5)
    finally:
        stop.set()
        await sampler
    return run, child, sizes


@pytest.fixture(scope="module")
def past(tmp_path_factory):
    tmux_dir = tempfile.mkdtemp(prefix="ts-replay-", dir="/tmp")
    base = tmp_path_factory.mktemp("replay")
    root = str(base / "runs")
    config = base / "config.toml"
    config.write_text(f'[hosts.box]\nruns_root = "{root}"\n')
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TMUX_TMPDIR", tmux_dir)
        env.delenv("TMUX", raising=False)
        try:
            run, child, sizes = asyncio.run(_make_past(LocalHost("box", runs_root=root), root))
            yield Past(root, config, run, child, sizes)
        finally:
            end_tmux_server("tmux")
            shutil.rmtree(tmux_dir, ignore_errors=True)


def gpu_recording(start: float, end: float, sizes: list) -> Recording:
    """A recorder's values for one card (this machine has none): 400 W of 700 W, a sample a second."""
    t, samples = start - 5, []
    while t <= end + 5:
        samples.append(GpuSample(t, 0, "GPU-0", 400.0, 700.0, 30000.0, 81920.0, 97.0))
        t += 1.0
    return Recording(gpus=tuple(samples), logs=tuple(sizes))


async def history_of(past: Past, target: str):
    history = await (read_history(LocalHost("box", runs_root=past.root), target))
    history.record(gpu_recording(history.start, history.end, past.sizes))
    with_sizes(history)
    return history


async def test_the_moments_of_a_stopped_and_relaunched_run(past):
    history = await history_of(past, past.run.run_id)
    kinds = [m.kind for m in moments_of(history)]
    assert kinds[0] == "start" and "stop" in kinds and "relaunch" in kinds and kinds[-1] in ("relaunch", "exit", "end"), kinds
    said = {m.kind: m.text for m in moments_of(history)}
    assert said["stop"] == "SIGTERM sent by a kill"
    assert said["relaunch"] == f"relaunched as {past.child.run_id}"
    assert said["end"] == "trainer ended: stopped"


async def test_replay_at_80x24_shows_the_run_as_it_was_then_and_steps_through_time(past):
    history = await history_of(past, past.run.run_id)
    steps = [e for e in history.events if e["event"] == "step"]
    when = steps[9]["time"]  # its 10th step (they come milliseconds apart)
    log = Path(past.root, past.run.run_id, "console.log").read_bytes()
    sized = [s for s in past.sizes if s.path.endswith(f"{past.run.run_id}/console.log") and s.time <= when]
    then = log[: sized[-1].size].decode(errors="replace").rstrip("\n").splitlines()
    later = log[sized[-1].size :].decode(errors="replace").splitlines()
    app = ReplayApp(history, moments_of(history), when)
    async with app.run_test(size=SIZE) as pilot:
        shown = lambda: screen_text(app)  # noqa: E731
        stats = lambda: str(app.screen.query_one("#stats", Static).render())  # noqa: E731
        await wait_for(pilot, lambda: "step 10 " in stats(), 20, "the stats at step 10")
        text = shown()
        assert "read-only: no key acts on the run" in text
        assert "GPU0" in text  # the card as recorded then (its figures past the 80 columns' cut)
        assert "400/700 W" in app.screen.query_one(GpuRow).shown.plain
        assert then[-1].strip()[:40] in text  # the log's last line then…
        assert not any(line.strip() and line.strip()[:40] in text for line in later if "step" in line)  # …and none after
        assert "loss (" in text and "┤" in text  # the curve up to then
        # n, moment by moment, to the kill's SIGTERM (the relaunch's, dated to its second, may come first)
        for following in [m for m in app.moments if m.time > when][:3]:
            await pilot.press("n")
            await wait_for(pilot, lambda: app.screen.when == following.time and "[now]" in shown(), 10, f"{following} (of {app.moments})")
            if following.kind == "stop":
                break
        assert "SIGTERM sent by a kill" in shown()
        await pilot.press("k", "e", "r", "R")  # no key acts on the run: none of the dashboard's
        assert app.is_running and app.screen.query_one("#when")
        await pilot.press("home")
        await wait_for(pilot, lambda: " +0s/" in shown(), 10, "the run's start")
        await pilot.press("full_stop")  # its first step
        await wait_for(pilot, lambda: "step 1 " in stats(), 10, "step 1")
        await pilot.press("end")
        await wait_for(pilot, lambda: "ended" in shown(), 10, "the run's end")


async def test_replay_of_a_session_trackside_did_not_launch_from_its_pane_recording(past):
    history = await history_of(past, "their-sft")
    assert history.run_id is None and history.tape is not None and history.tape.recorded
    middle = next(s.time for s in past.sizes if "panes/" in s.path and s.size > 60)
    app = ReplayApp(history, moments_of(history), middle)
    async with app.run_test(size=SIZE) as pilot:
        shown = lambda: screen_text(app)  # noqa: E731
        await wait_for(pilot, lambda: "their-sft" in shown() and "step " in shown(), 20, "the session's fold")
        first = app.screen.frame.console.step
        assert first is not None and first < 40
        await pilot.press("end")
        await wait_for(pilot, lambda: app.screen.frame.console.step == 40, 10, "its last step at its end")
        assert "step 40 loss=1.00" in shown()


def test_at_outside_the_runs_life_is_a_usage_error_naming_it(past, capsys):
    for at, said in (("-99h", "before the run's start"), ("+99h", "after the run's end"), ("soon", "expected +DURATION")):
        code = main(["replay", past.run.run_id, "--config", str(past.config), "--at", at])
        err = capsys.readouterr().err
        assert code == 2 and said in err and "Traceback" not in err, err
    code = main(["replay", "20990101-0000-0000", "--config", str(past.config)])
    assert code == 1 and "no run 20990101-0000-0000" in capsys.readouterr().err
