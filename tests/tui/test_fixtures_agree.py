"""The fleet and `trackside runs --json` say the same of every captured trainer.

Each fixture of tests/fixtures/consoles/ (real libraries' output, as their panes received
it) is printed again in a tmux pane of 80×24 on this test's own tmux server while a
dashboard watches; then the fleet's row and the headless command's JSON must agree on
state, step, loss and ETA: one fold, one record, whichever view reads it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from backends.alerts import format_duration
from backends.hosts import LocalHost
from tests.backends.test_formats import FIXTURES, NAMES
from tests.backends.test_replay import BLANK, recorded
from tests.backends.test_runs import tmux_dir  # noqa: F401 (fixture)
from tests.tui.conftest import wait_for
from tui.app import TracksideApp, Watched
from tui.screens.fleet import run_cells

SESSIONS = {re.sub(r"[^A-Za-z0-9_-]", "_", name): name for name in NAMES}


async def test_the_fleet_and_runs_json_agree_on_every_fixture(tmux_dir, runs_root, tmp_path):  # noqa: F811
    host = LocalHost(runs_root=runs_root)
    app = TracksideApp([Watched(host, smi="nvidia-smi-absent")], poll_interval=0.5)
    async with app.run_test(size=(160, 48)) as pilot:
        for session, name in SESSIONS.items():
            raw = FIXTURES / f"{name}.raw"
            subprocess.run(
                ["tmux", "new-session", "-d", "-s", session, "-x", "80", "-y", "24",
                 "sh", "-c", 'sleep 1; cat "$1"; sleep 600', "sh", str(raw)],
                check=True,
            )  # fmt: skip
        keys = [f"local/{s}" for s in SESSIONS]
        await wait_for(pilot, lambda: all(k in app.runs for k in keys), 30, "every session in the fleet")

        # A row whose library recorded a training loss that trackside reads (some are blank
        # by design: test_replay's BLANK) shows one once its pane's output is read.
        with_loss = [f"local/{s}" for s, name in SESSIONS.items()
                     if recorded(name)["last_loss"] is not None and "last_loss" not in BLANK.get(name, ())]  # fmt: skip

        def settled():
            return all(app.runs[k].loss is not None for k in with_loss)

        await wait_for(pilot, settled, 60, "a loss on every row that reads one")
        await pilot.pause(3.0)  # a listing or two after the last byte: every row as it ends
        config = tmp_path / "config.toml"
        config.write_text(f"[hosts.box]\nruns_root = {json.dumps(runs_root)}\n")
        done = subprocess.run([sys.executable, "-m", "tui.cli", "runs", "--json", "--config", str(config)],
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert done.returncode == 0, done.stderr
        listed = {r["session"]: r for r in json.loads(done.stdout)}
        for session in SESSIONS:
            run, doc = app.runs[f"local/{session}"], listed[session]
            cells = run_cells(run, app.hosts["local"])
            shown = (run.state_label, run.step, run.loss, cells["eta"])
            said = (doc["status"], doc["last_step"], doc["last_loss"], format_duration(doc["eta_s"]))
            assert shown == said, f"{session}: fleet {shown}, runs --json {said}"
            assert cells["state"].plain.startswith(doc["status"])


def test_every_fixture_has_a_session_name():
    assert len(SESSIONS) == len(NAMES) and all(Path(FIXTURES / f"{n}.raw").exists() for n in NAMES)
