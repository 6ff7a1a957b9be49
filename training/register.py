"""A `trackside train` typed by hand in a tmux pane registers itself as a run.

The seeds' operator starts runs by typing the trainer at a shell in tmux. Such a run has
no launch behind it, so it writes what a launch writes: `manifest.json` in its run dir
(naming its tmux session, the pane's process, its argv and parameters) and, when it ends,
`exit_status`; and while it runs, `trainer.pid`, which the listing checks, since the
pane's shell outlives it. From then on it is a run like any other: the fleet, `runs`,
`plot`, `k`, `e`, `r`. Only a run dir under the runs root, named by a run id, is
registered: the listing reads nothing else.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from training import contract
from training.params import read_params

MANIFEST = "manifest.json"
PID_FILE = "trainer.pid"  # read by backends/runs/listing.py
EXIT_STATUS_FILE = "exit_status"


def _pane() -> tuple[str, int] | None:
    """(session, pane pid) of $TMUX_PANE, or None outside tmux."""
    pane = os.environ.get("TMUX_PANE")
    if not pane or not os.environ.get("TMUX"):
        return None
    try:
        shown = subprocess.run(
            ["tmux", "-u", "display-message", "-p", "-t", pane, "#{pane_pid}:#{session_name}"],
            capture_output=True, text=True, timeout=10,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    pid, _, session = shown.stdout.strip().partition(":")
    return (session, int(pid)) if shown.returncode == 0 and pid.isdigit() and session else None


def register(run_dir: Path, argv: list[str], runs_root: Path) -> bool:
    """Write the run's manifest if it has none and it runs in a tmux pane; whether it did."""
    run_dir = Path(run_dir)
    if (run_dir / MANIFEST).exists() or run_dir.parent.resolve() != runs_root.resolve():
        return False
    if not contract.RUN_ID.fullmatch(run_dir.name):
        return False
    where = _pane()
    if where is None:
        return False
    session, pane_pid = where
    # As it was started, so that a relaunch starts it again: `trackside train …`, or
    # `python -m training train …` (whose argv[0] is the package's __main__.py).
    program = [sys.executable, "-m", "training"] if sys.argv[0].endswith("__main__.py") else [sys.argv[0]]
    command = [*program, *argv]
    manifest = {
        "run_id": run_dir.name, "host": socket.gethostname(), "session": session, "argv": command,
        "command": command, "trainer": True, "params": read_params(argv), "parent": None,
        "resume_from": None, "run_dir": str(run_dir), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "ended": None, "exit_status": None, "pane_pid": pane_pid, "registered": True,
    }  # fmt: skip
    run_dir.mkdir(parents=True, exist_ok=True)
    _write(run_dir / PID_FILE, f"{os.getpid()}\n")
    _write(run_dir / MANIFEST, json.dumps(manifest, indent=1) + "\n")
    return True


def ended(run_dir: Path, code: int) -> None:
    """Record how a registered run ended: what a launch's shell would have written."""
    _write(Path(run_dir) / EXIT_STATUS_FILE, f"{code}\n")


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
