"""`trackside train` typed by hand at a shell in tmux, as the seeds' operator starts runs, is
a run: listed by its run id, plotted, stopped by `kill` with the shell and its session left
alone, and read as finished when it ends on its own."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from tests.backends.test_foreign_runs import REPO, trackside
from tests.backends.test_runs import PY, tmux_dir  # noqa: F401 (fixture)
from training.contract import RUN_ID


def typed_runs(env: dict) -> list[dict]:
    done = trackside("runs", "--json", env=env)
    assert done.returncode == 0, done.stderr
    return [r for r in json.loads(done.stdout) if r["session"] == "typed" and r["run_id"]]


def wait(what: str, condition, timeout: float = 90.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def test_a_trainer_typed_at_a_shell_in_tmux_is_a_run(tmp_path, tmux_dir):  # noqa: F811
    root = tmp_path / "runs"
    env = {**os.environ, "TRACKSIDE_RUNS_ROOT": str(root), "HOME": str(tmp_path / "home")}
    subprocess.run(
        ["tmux", "new-session", "-d", "-s", "typed", "-x", "120", "-y", "30", "-c", str(REPO),
         "-e", f"TRACKSIDE_RUNS_ROOT={root}", "bash", "--norc", "--noprofile", "-i"],
        check=True, env=env,
    )  # fmt: skip
    shell = int(subprocess.run(["tmux", "list-panes", "-t", "=typed:", "-F", "#{pane_pid}"], capture_output=True, text=True).stdout)

    def type_in(line: str) -> None:
        subprocess.run(["tmux", "send-keys", "-t", "=typed:", line, "Enter"], check=True)

    type_in(f"{PY} -m training train --synthetic --steps 100000 --max-seq-len 256 --ttt-steps 2 --save-every 100000")
    [run] = wait("the typed run to be listed with a step", lambda: [r for r in typed_runs(env) if r["last_step"]] or None)
    assert RUN_ID.fullmatch(run["run_id"]) and run["status"] == "running" and run["params"] == {"max_seq_len": 256, "ttt_steps": 2, "steps": 100000, "save_every": 100000}
    plotted = trackside("plot", run["run_id"], "--json", env=env)
    assert plotted.returncode == 0 and json.loads(plotted.stdout)[0]["points"], plotted.stderr

    stopped = trackside("kill", run["run_id"], "--json", env=env)
    assert stopped.returncode == 0, stopped.stderr
    assert shell not in json.loads(stopped.stdout)["signalled"]  # the job stopped, not the user's shell
    [after] = typed_runs(env)
    assert after["status"] == "stopped" and after["pids"] == []
    os.kill(shell, 0)  # still there, in its session

    again = trackside("relaunch", run["run_id"], "--set", "ttt_steps=3", "--json", env=env)
    assert again.returncode == 0, again.stderr
    child = json.loads(again.stdout)
    assert child["parent"] == run["run_id"]
    assert trackside("kill", child["run_id"], env=env).returncode == 0

    type_in(f"{PY} -m training train --synthetic --steps 3 --max-seq-len 256 --ttt-steps 2")
    finished = wait("the second typed run to finish", lambda: [r for r in typed_runs(env) if r["run_id"] != run["run_id"] and r["status"] == "finished"] or None)
    assert finished[0]["last_step"] == 3 and Path(finished[0]["run_dir"], "exit_status").read_text().strip() == "0"
