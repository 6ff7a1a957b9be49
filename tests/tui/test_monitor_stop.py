"""A host's monitor ends when it is stopped, whenever the stop comes and whatever its host's
commands leave behind: the app's exit waits for its monitors, so one that never ends hangs
the dashboard's quit for good. A CI run hung so until its 300 s timeout
(tests/tui/test_dflash_relaunch.py, the app's exit waiting in `on_unmount` for one worker).

Two ways there, each tried here: a command whose own child still held its output kept the
stopped call waiting for that child (backends/hosts/local.py, `reaped`); and a bound that
lost the stop as the awaited call returned (backends/hosts/local.py, `LocalHost.run`), so
the lister polled on."""

from __future__ import annotations

import ast
import asyncio
import subprocess
import uuid
from pathlib import Path

from textual.worker import Worker

from backends import runs, tmux
from backends.hosts import LocalHost
from backends.logs import recording
from tests.tui.conftest import wait_for
from tui.app import TracksideApp, Watched

ROOT = Path(__file__).resolve().parents[2]


def _stopped_inside(monkeypatch, module, name: str, app: TracksideApp, host_name: str) -> list[Worker]:
    """Make `module.name`'s next call stop the host's monitor as its result is ready; the
    monitor's workers then running are in the list returned once it has."""
    real, running = getattr(module, name), []

    async def then_stop(*args, **kwargs):
        result = await real(*args, **kwargs)
        if not running:
            running.extend(w for w in app.workers if w.group == "monitor" and w.is_running)
            app.monitors[host_name].stop()
        return result

    monkeypatch.setattr(module, name, then_stop)
    return running


async def test_a_monitor_stopped_as_its_listing_returns_ends_its_lister(local_host, monkeypatch):
    app = TracksideApp([Watched(local_host)], poll_interval=0.2)
    running = _stopped_inside(monkeypatch, runs, "list_runs", app, local_host.name)
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: running, timeout=30, what="a listing")
        await wait_for(pilot, lambda: all(w.is_finished for w in running), timeout=10, what="the stopped monitor's workers to end")


async def test_a_monitor_stopped_as_a_pane_capture_returns_ends_its_pane_watcher(local_host, monkeypatch, tmp_path):
    await tmux.new_session(local_host, "theirs", ["sleep", "600"], recording.recorder(str(tmp_path / "console.log")))
    app = TracksideApp([Watched(local_host)], poll_interval=0.2)
    running = _stopped_inside(monkeypatch, tmux, "capture_pane", app, local_host.name)
    async with app.run_test() as pilot:
        key = f"{local_host.name}/theirs"
        await wait_for(pilot, lambda: key in app.runs, timeout=30, what="the foreign session listed")
        app.open_run(key)  # followed while on screen: its pane is captured
        await wait_for(pilot, lambda: running, timeout=30, what="a pane capture")
        await wait_for(pilot, lambda: all(w.is_finished for w in running), timeout=10, what="the stopped monitor's workers to end")


async def test_the_dashboard_quits_while_its_hosts_commands_leave_a_child_holding_their_output(tmp_path, tmux_socket):
    # The host's prefix (as a container's `pct exec` might) starts a child beside each
    # command that holds its output, and waits for it: each listing waits for its timeout,
    # and is stopped meanwhile. The child's argv is this test's own, to end them all after.
    holder = f"sleep 120.{uuid.uuid4().int % 10**9:09d}"
    started = tmp_path / "started"
    host = LocalHost("local", prefix=["sh", "-c", f'{holder} & echo >> "$0"; "$@"; wait', str(started)],
                     runs_root=str(tmp_path / "runs"))  # fmt: skip
    host.tmux_socket = tmux_socket
    app = TracksideApp([Watched(host)], poll_interval=0.2)
    try:
        async with asyncio.timeout(60):
            async with app.run_test() as pilot:
                await wait_for(pilot, lambda: started.exists() and started.read_text().count("\n") >= 2, timeout=30,
                               what="the host's commands under way")  # fmt: skip
    finally:
        subprocess.run(["pkill", "-f", holder])


def test_nothing_bounds_an_await_with_asyncio_wait_for():
    """The class, not the places: `asyncio.timeout` keeps the stop (why: LocalHost.run)."""
    found = []
    for folder in ("tui", "backends", "training", "scripts", "bench"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Attribute) and node.attr == "wait_for" and getattr(node.value, "id", None) == "asyncio":
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, f"use asyncio.timeout, not asyncio.wait_for (backends/hosts/local.py, LocalHost.run): {found}"
