"""A session whose program returned to its shell is "exited", with its last readings, not
running (issue 43): the pane's process is an interactive shell running nothing."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.backends.test_foreign_runs import config, trackside  # noqa: F401 (fixture)
from tests.backends.test_runs import tmux_dir  # noqa: F401 (fixture)


def listed(config: str) -> dict:  # noqa: F811
    done = trackside("runs", "--json", "--config", config)
    assert done.returncode == 0, done.stderr
    return {run["session"]: run for run in json.loads(done.stdout)}


def prompt_after(session: str, typed: str) -> None:
    """Type a command at the session's shell, and wait until it has returned to its prompt."""
    subprocess.run(["tmux", "send-keys", "-t", f"={session}:", typed + "; tmux wait-for -S back", "Enter"], check=True)
    subprocess.run(["tmux", "wait-for", "back"], check=True, timeout=60)


def test_a_program_back_at_its_shell_is_exited_with_its_last_readings(config):  # noqa: F811
    subprocess.run(["tmux", "new-session", "-d", "-s", "typed", "-x", "80", "-y", "24", "bash", "--norc", "--noprofile", "-i"], check=True)
    subprocess.run(["tmux", "send-keys", "-t", "=typed:", "printf 'step=3 loss=2.5\\n'; sleep 600", "Enter"], check=True)
    for _ in range(100):  # the first listing records the pane from here on; a later one reads the line
        run = listed(config)["typed"]
        if run["last_step"] == 3:
            break
    assert (run["state"], run["last_step"], run["last_loss"]) == ("running", 3, pytest.approx(2.5))  # sleep runs under the shell
    subprocess.run(["tmux", "send-keys", "-t", "=typed:", "C-c", ""], check=True)
    prompt_after("typed", "printf 'step=4 loss=2.25\\n'")
    run = listed(config)["typed"]
    assert (run["state"], run["last_step"], run["last_loss"], run["eta_s"]) == ("exited", 4, pytest.approx(2.25), None)
    table = trackside("runs", "--config", config).stdout
    assert any(line.split()[1:2] == ["typed"] and "exited" in line for line in table.splitlines()), table


def test_a_shell_that_ran_nothing_and_a_program_run_by_a_script_are_not_exited(config, tmp_path):  # noqa: F811
    subprocess.run(["tmux", "new-session", "-d", "-s", "idle", "bash", "--norc", "--noprofile", "-i"], check=True)
    subprocess.run(["tmux", "new-session", "-d", "-s", "scripted", "sh", "-c", "echo step=1 loss=1.0; sleep 600"], check=True)
    prompt_after("idle", "true")
    runs = listed(config)
    assert runs["idle"]["state"] == "running" and runs["idle"]["last_step"] is None
    assert runs["scripted"]["state"] == "running"


def test_a_background_job_does_not_keep_a_program_back_at_its_shell_running(config):  # noqa: F811
    """The shell's foreground is what returned: a job left in the background (`tensorboard &`
    before the trainer) is not the program; a job stopped with ^Z still is."""
    subprocess.run(["tmux", "new-session", "-d", "-s", "bg", "-x", "80", "-y", "24", "bash", "--norc", "--noprofile", "-i"], check=True)
    prompt_after("bg", "sleep 600 & true")
    subprocess.run(["tmux", "send-keys", "-t", "=bg:", "printf 'step=3 loss=2.5\\n'; sleep 700", "Enter"], check=True)
    for _ in range(100):  # the first listing records the pane from here on; a later one reads the line
        run = listed(config)["bg"]
        if run["last_step"] == 3:
            break
    assert (run["state"], run["last_step"]) == ("running", 3)
    subprocess.run(["tmux", "send-keys", "-t", "=bg:", "C-z", ""], check=True)
    prompt_after("bg", "printf 'step=4 loss=2.25\\n'")
    assert (listed(config)["bg"]["state"], listed(config)["bg"]["last_step"]) == ("running", 4)  # the stopped sleep 700
    prompt_after("bg", "kill -9 %2")
    run = listed(config)["bg"]
    assert (run["state"], run["last_step"], run["last_loss"]) == ("exited", 4, pytest.approx(2.25))
