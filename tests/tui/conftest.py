"""A LocalHost on its own tmux server and runs root, so the dashboard's tests touch nothing else."""

from __future__ import annotations

import asyncio
import sys
import time
import uuid

import pytest

from backends import runs
from backends.hosts import LocalHost
from scripts.local_box import end_tmux_server
from tests.waiting import HANG_S, niced, trainer_started

# The trainer as the dashboard's tests run it (a host's train command): niced.
TRAINER = niced([sys.executable, "-m", "training", "train"])
TRAIN = [*TRAINER, "--synthetic"]


# What an app under test said in notifications, kept on the app (a toast is gone by the
# time a wait times out): the last of them go into wait_for's failure, which then says
# why, not only what. (On the app: pytest imports this file as `conftest`, the tests as
# `tests.tui.conftest`, so a list here would be two lists.)
@pytest.fixture(autouse=True)
def _notifications_kept(monkeypatch):
    from tui.app import TracksideApp

    notify = TracksideApp.notify

    def kept(self, message, *args, **kwargs):
        self.__dict__.setdefault("told_in_test", []).append(f"{time.strftime('%H:%M:%S')} {message}")
        return notify(self, message, *args, **kwargs)

    monkeypatch.setattr(TracksideApp, "notify", kept)


@pytest.fixture
def tmux_socket():
    name = f"trackside-tui-{uuid.uuid4().hex[:8]}"
    yield name
    end_tmux_server("tmux", "-L", name)


@pytest.fixture
def local_host(tmp_path, tmux_socket):
    host = LocalHost("local", runs_root=str(tmp_path / "runs"))
    host.tmux_socket = tmux_socket  # backends.tmux reads this attribute
    return host


async def wait_for(pilot, condition, timeout: float = 60.0, what: str = "condition"):
    """Let the app run until condition() is true; fail naming what never happened."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        await pilot.pause(0.1)
    raise AssertionError(
        f"timed out after {timeout:.0f}s waiting for {what} (screens: {pilot.app.screen_stack}, "
        f"focused: {pilot.app.focused}; the app's last notifications: {getattr(pilot.app, 'told_in_test', [])[-8:]})"
    )


async def launch_and_wait_ended(host, argv: list[str], timeout: float = 90.0) -> runs.RunInfo:
    """A short real run, launched and left to end: the parent a relaunch test starts from.
    Its start (a torch import as long as the machine's load makes it) is waited for up to
    HANG_S, its steps and end up to `timeout`."""
    parent = await runs.launch(host, argv)

    async def running() -> bool:
        return (await runs.list_runs(host))[0].state is runs.RunPhase.RUNNING

    deadline = time.monotonic() + HANG_S
    while not trainer_started(parent.run_dir) and await running():
        assert time.monotonic() < deadline, "the parent run never started"
        await asyncio.sleep(0.2)
    deadline = time.monotonic() + timeout
    while await running():
        assert time.monotonic() < deadline, "the parent run never ended"
        await asyncio.sleep(0.2)
    return parent


async def demo_run(pilot, screen):
    """The demo's run on its screen once its launch has ended: at its trainer's start event,
    as long after as the machine's load makes the torch import (up to HANG_S), or failed,
    saying why."""
    launching = lambda: any(w.group == "actions" and w.is_running for w in pilot.app.workers)  # noqa: E731
    await wait_for(pilot, lambda: screen.run or not launching(), HANG_S, "the demo run's launch to end")
    assert screen.run is not None, f"the demo run did not launch: {screen_text(pilot.app)}"
    return screen.run


def screen_text(app) -> str:
    """What the screen shows, as plain text (every visible widget's rendered lines)."""
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())
