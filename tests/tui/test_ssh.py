"""The dashboard against the real OpenSSH server of the backends tests: a run launched,
watched, killed and relaunched over SSH, a host that goes away and comes back, and GPUs
read through one long-lived nvidia-smi channel per host."""

from __future__ import annotations

import asyncio
import os
import pwd
import sys
from pathlib import Path

import pytest

from backends import params as run_params
from backends import runs, tmux
from backends.gpu import GpuProcess
from tests.backends.test_ssh import pid_alive
from tests.backends.test_watch import TRAIN_COMMAND
from tests.tui.conftest import screen_text, wait_for
from tui.app import Demo, TracksideApp, Watched
from tui.screens.edit import EditScreen
from tui.screens.kill import KillConfirm, KillReportScreen
from tui.screens.run import RunScreen

PARAMS = {"max_seq_len": 256, "ttt_steps": 2, "steps": 100000, "save_every": 100000}


@pytest.mark.slow
async def test_launch_kill_edit_relaunch_over_ssh(sshd, runs_root, tmux_socket):
    if not sshd.running:
        sshd.start()
    host = sshd.host("gpu-box", runs_root=runs_root)
    host.tmux_socket = tmux_socket
    argv = run_params.apply([str(sshd.python), "-m", "training", "train", "--synthetic"], PARAMS)
    app = TracksideApp([Watched(host, smi="nvidia-smi-absent")], demo=Demo(argv, "tui-ssh", dict(PARAMS)), grace_s=20)
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            screen = await wait_for(pilot, lambda: isinstance(app.screen, RunScreen) and app.screen.is_mounted and app.screen, 10, "the run screen")
            # A launch returns once the trainer has started (its start event): loading over SSH.
            first = await wait_for(pilot, lambda: screen.run, 90, "the run to launch over SSH")
            await wait_for(pilot, lambda: len(first.steps) >= 2, 90, "step events over SSH")
            assert "no GPU on gpu-box" in screen_text(app) or "GPUs on gpu-box" in screen_text(app)

            await pilot.press("k")
            confirm = await wait_for(pilot, lambda: isinstance(app.screen, KillConfirm) and app.screen.is_mounted and app.screen, 15, "the kill modal")
            await pilot.press("y")
            report = await wait_for(pilot, lambda: isinstance(app.screen, KillReportScreen) and app.screen.is_mounted and app.screen, 40, "the report")
            assert set(confirm.plan.pids) <= set(report.report.signalled) and not report.report.survivors
            assert "tui-ssh" not in await tmux.list_sessions(host)
            await pilot.press("escape")

            await pilot.press("e")
            form = await wait_for(pilot, lambda: isinstance(app.screen, EditScreen) and app.screen.is_mounted and app.screen, 5, "the edit form")
            form.query_one("#param-ttt_steps").value = "3"
            await pilot.pause()
            await pilot.click("#keep")
            await pilot.press("r")
            second = await wait_for(pilot, lambda: screen.run_key != first.key and screen.run, 90, "the relaunched run")
            await wait_for(pilot, lambda: second.start is not None, 90, "its start event over SSH")
            assert second.start["config"]["ttt_steps"] == 3
    finally:
        await host.close()


def test_a_dashboard_of_ssh_hosts_only_logs_its_errors_in_the_tests_own_home(sshd):
    """With no local host, the error log is under ~/.trackside/runs: the session's HOME
    (tests/conftest.py), not the user's (the suite wrote there; issue 32, item 14)."""
    app = TracksideApp([Watched(sshd.host("gpu-box"), smi="nvidia-smi-absent")])
    assert app.error_log == os.path.join(os.environ["HOME"], ".trackside", "runs", "dashboard-errors.log")
    real = pwd.getpwuid(os.getuid()).pw_dir.rstrip("/") + "/"
    assert not app.error_log.startswith(real), app.error_log


def test_an_ssh_only_dashboard_logs_its_errors_under_the_runs_root_variable(sshd, tmp_path, monkeypatch):
    """$TRACKSIDE_RUNS_ROOT is this machine's runs root for every command: the error log of
    a dashboard with no local host went to ~/.trackside/runs regardless."""
    monkeypatch.setenv("TRACKSIDE_RUNS_ROOT", str(tmp_path / "runs"))
    app = TracksideApp([Watched(sshd.host("gpu-box"), smi="nvidia-smi-absent")])
    assert app.error_log == str(tmp_path / "runs" / "dashboard-errors.log")


async def test_host_lost_and_back(fresh_sshd):
    host = fresh_sshd.host("flaky", backoff_cap=1.0)
    app = TracksideApp([Watched(host, smi="nvidia-smi-absent")])
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            state = app.hosts["flaky"]
            await wait_for(pilot, lambda: state.status == "ok", 20, "the host to answer")
            fresh_sshd.stop()
            await wait_for(pilot, lambda: state.status == "offline", 30, "the host to read offline")
            assert "lost:flaky" in app.alerts
            assert "flaky lost" in screen_text(app)
            seen = set()  # the GPU stream's own failures must not read as the host answering
            for _ in range(30):
                await asyncio.sleep(0.2)
                seen.add(state.status)
            assert seen == {"offline"}
            fresh_sshd.start()
            await wait_for(pilot, lambda: state.status == "ok", 30, "the host to come back")
            await pilot.pause()
            assert "lost:flaky" not in app.alerts
            assert any("flaky is back" in str(n.message) for n in app._notifications)
    finally:
        await host.close()


async def test_a_kill_the_lost_host_never_got_leaves_the_runs_end_news(fresh_sshd, runs_root, tmux_socket):
    """y pressed after the host went away: the dashboard says the kill failed, the run
    lives on and, when it fails later by itself, that is alerted: a kill that did not
    happen answers for nothing (it had silenced the run's end for good)."""
    host = fresh_sshd.host("flaky", runs_root=runs_root, backoff_cap=1.0)
    host.tmux_socket = tmux_socket
    app = TracksideApp([Watched(host, smi="nvidia-smi-absent")], poll_interval=0.2)
    told: list[str] = []
    notify = app.notify
    app.notify = lambda message, **kwargs: (told.append(str(message)), notify(message, **kwargs))[1]
    try:
        info = await runs.launch(host, [*TRAIN_COMMAND, "fail-when"], train_command=TRAIN_COMMAND, startup_s=0)
        key = f"flaky/{info.run_id}"
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_for(pilot, lambda: key in app.runs and app.runs[key].steps, 30, "the run's steps")
            app.open_run(key)
            await pilot.pause()
            await pilot.press("k")
            confirm = await wait_for(pilot, lambda: isinstance(app.screen, KillConfirm) and app.screen.is_mounted and app.screen, 15, "the kill dialog")
            fresh_sshd.stop()
            await pilot.press("y")
            await wait_for(pilot, lambda: any(t.startswith(f"could not kill {key}") for t in told), 30, "the failed kill told")
            assert all(pid_alive(pid) for pid in confirm.plan.pids)  # sshd is on loopback: the run's processes are ours to see
            fresh_sshd.start()
            await wait_for(pilot, lambda: app.hosts["flaky"].status == "ok", 30, "the host back")
            Path(info.run_dir, "fail-now").touch()
            await wait_for(pilot, lambda: f"failed:{key}" in app.alerts, 30, "the run's failure alerted")
    finally:
        await host.close()


FAKE_SMI = Path(__file__).resolve().parents[1] / "fake_nvidia_smi.py"


async def test_gpus_stream_over_one_channel_per_host(sshd, runs_root, tmux_socket, tmp_path):
    if not sshd.running:
        sshd.start()
    calls = tmp_path / "smi-calls"
    smi = tmp_path / "nvidia-smi"
    smi.write_text(
        f'#!/bin/sh\necho "$*" >> {calls}\n'
        f'FAKE_NVIDIA_SMI_GPUS=2 FAKE_NVIDIA_SMI_STATE=load exec {sys.executable} -S {FAKE_SMI} "$@"\n'
    )
    smi.chmod(0o755)
    host = sshd.host("streamed", runs_root=runs_root)
    host.tmux_socket = tmux_socket
    snapshots, listings = [], []

    class CountingApp(TracksideApp):
        CSS_PATH = str(Path(__file__).resolve().parents[2] / "tui" / TracksideApp.CSS_PATH)

        def on_gpus_polled(self, message) -> None:
            snapshots.append(message.snapshot)

        def on_runs_listed(self, message) -> None:
            listings.append(message)

    app = CountingApp([Watched(host, smi=str(smi))], poll_interval=0.2)
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_for(pilot, lambda: len(snapshots) >= 20, 30, "20 GPU snapshots")
    finally:
        await host.close()
    started = calls.read_text().splitlines()
    gpu_reads = [c for c in started if "--query-gpu" in c]
    # One full read, then every sample from one `-lms` channel (polling started nvidia-smi
    # twice per sample: 40 times here).
    assert len(gpu_reads) == 2 and gpu_reads[1].endswith("-lms 200"), started
    # Per-process rows: with the full read, then once per listing, not per sample.
    assert sum("--query-compute-apps" in c for c in started) <= 1 + len(listings) < len(snapshots), started
    last = snapshots[-1]
    assert last.streamed and [g.index for g in last.gpus] == [0, 1]
    assert last.processes == (GpuProcess(525, 0, 25578, "python3"),)
