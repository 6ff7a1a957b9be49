"""A newcomer's first minute: `trackside demo` in a real terminal (a tmux pane), read
with capture-pane and driven with send-keys, asserting on what a person sees."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

TRACKSIDE = Path(sys.executable).parent / "trackside"
LOSS = re.compile(r"\bloss (\d+\.\d+)")


def tmux(socket: str, *args: str) -> str:
    return subprocess.run(["tmux", "-L", socket, *args], capture_output=True, text=True, check=True).stdout


def wait_screen(socket: str, condition, timeout: float, what: str) -> str:
    deadline = time.monotonic() + timeout
    screen = ""
    while time.monotonic() < deadline:
        screen = tmux(socket, "capture-pane", "-p", "-t", "newcomer")
        if condition(screen):
            return screen
        time.sleep(0.5)
    raise AssertionError(f"after {timeout:.0f}s the screen shows no {what}:\n{screen}")


@pytest.mark.slow
def test_demo_shows_a_falling_loss_and_kill_asks_first(tmux_socket, tmp_path):
    command = f"TRACKSIDE_RUNS_ROOT={tmp_path}/runs {TRACKSIDE} demo"
    tmux(tmux_socket, "-f", "/dev/null", "new-session", "-d", "-s", "newcomer", "-x", "160", "-y", "48", command)
    tmux(tmux_socket, "resize-window", "-t", "newcomer", "-x", "160", "-y", "48")

    screen = wait_screen(
        tmux_socket, lambda s: LOSS.search(s) and "no GPU on this machine" in s, 120, "loss value and GPU state"
    )
    first = float(LOSS.search(screen).group(1))
    wait_screen(
        tmux_socket,
        lambda s: (m := LOSS.search(s)) and float(m.group(1)) < first - 0.3,
        120,
        f"loss falling below {first - 0.3:.2f}",
    )
    assert "step" in screen and "tokens/s" in screen

    tmux(tmux_socket, "send-keys", "-t", "newcomer", "k")
    modal = wait_screen(tmux_socket, lambda s: "Stop run" in s, 20, "kill confirmation")
    assert "trackside-demo-" in modal and "processes" in modal
    tmux(tmux_socket, "send-keys", "-t", "newcomer", "n")
    wait_screen(tmux_socket, lambda s: "Stop run" not in s, 10, "modal closing on No")
    demo_sessions = [s for s in tmux(tmux_socket, "list-sessions", "-F", "#{session_name}").split() if s.startswith("trackside-demo-")]
    assert demo_sessions, "answering No must leave the run alive"
    tmux(tmux_socket, "send-keys", "-t", "newcomer", "q")
