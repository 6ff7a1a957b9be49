"""`trackside launch` and `trackside relaunch` say how the launch was judged: started by the
trainer's start event, alive after the short window (any other program), or failed before
its start event, seconds after the window (issue 32, item 3)."""

from __future__ import annotations

import json
import re

from tests.backends.test_cli import cli, config  # noqa: F401 (fixtures)
from tests.backends.test_runs import stand_in_trainer, tmux_dir  # noqa: F401 (fixtures)


def test_launch_and_relaunch_say_how_the_start_was_judged(capsys, config):
    code, out, err = cli(capsys, "launch", "--config", config, "--", "trackside", "train", "--synthetic")
    assert code == 0, err
    assert re.search(r"^started: its start event came \d+\.\ds after its launch$", out, re.M), out
    run_id = re.search(r"^launched (\S+) ", out)[1]
    code, out, err = cli(capsys, "relaunch", run_id, "--config", config, "--set", "ttt_steps=5")
    assert code == 0 and f"(from {run_id})" in out and "\nstarted: its start event came " in out, err
    code, out, err = cli(capsys, "launch", "--config", config, "--", "sleep", "60")
    assert code == 0 and out.endswith("\nalive after 2s (no start event waited for)\n"), out


def test_launch_of_a_trainer_that_dies_after_the_window_fails(capsys, tmp_path, runs_root, tmux_dir):
    refuses = stand_in_trainer(tmp_path, "refuses", "time.sleep(4); print('--block-size needs --drafter dflash', flush=True); sys.exit(2)")
    path = tmp_path / "refuses.toml"
    path.write_text(f"[hosts.box]\nruns_root = {json.dumps(runs_root)}\ntrain_command = {json.dumps(refuses)}\n")
    code, out, err = cli(capsys, "launch", "--config", str(path), "--", "trackside", "train", "--synthetic")
    assert code == 1 and out == "", out
    assert "exited with status 2" in err and "before its start event" in err and "| --block-size needs --drafter dflash" in err


def test_relaunch_says_where_the_run_went_when_it_cannot_keep_its_session_name(capsys, config):
    code, out, err = cli(capsys, "launch", "--config", config, "--session", "mytrain", "--", "sleep", "60")
    assert code == 0, err
    run_id = re.search(r"^launched (\S+) ", out)[1]
    code, out, err = cli(capsys, "relaunch", "--json", run_id, "--config", config)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["session_note"] == f"its parent still runs in tmux session mytrain: this run is in tmux session {doc['session']}"
    code, out, err = cli(capsys, "kill", run_id, "--config", config)
    assert code == 0, err
    code, out, err = cli(capsys, "relaunch", run_id, "--config", config)
    assert code == 0 and "in tmux session mytrain\n" in out and "this run is in" not in out, out
