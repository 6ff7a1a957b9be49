"""This machine standing in for a GPU box: a tmux server of one's own, ended with what its
panes run, and an nvidia-smi answered by the fake (tests/fake_nvidia_smi.py, a program the
wrapper runs, not a module anyone imports)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GPUS = 8


def end_tmux_server(*tmux: str) -> None:
    """Kill a tmux server and what its panes run. Run panes start under an sh that traps
    SIGHUP (backends/runs/launch.py), and a program that outlives the hangup would go on
    after the server: each pane's process group is killed first (a pane is a session
    leader, its program in its group)."""
    panes = subprocess.run([*tmux, "list-panes", "-a", "-F", "#{pane_pid}"], capture_output=True, text=True)
    for pid in panes.stdout.split():
        try:
            os.killpg(int(pid), signal.SIGKILL)
        except (ProcessLookupError, PermissionError, ValueError):
            pass
    subprocess.run([*tmux, "kill-server"], capture_output=True)


def write_smi_wrapper(directory: Path) -> str:
    """nvidia-smi for every host: the fake with eight H200s under load (the env must reach
    the remote command, and a wrapper carries it whatever the host's prefix)."""
    path = directory / "nvidia-smi"
    fake = REPO / "tests" / "fake_nvidia_smi.py"
    path.write_text(f'#!/bin/sh\nFAKE_NVIDIA_SMI_GPUS={GPUS} FAKE_NVIDIA_SMI_STATE=load exec {sys.executable} -S {fake} "$@"\n')
    path.chmod(0o755)
    return str(path)
