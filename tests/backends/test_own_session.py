"""The dashboard's own tmux session: recognised by its pane ($TMUX_PANE, on the same tmux
server only) or by our process in a pane's tree; listed as this dashboard's; never killed,
from the CLI either (exit 2, the session alive)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from backends import kill, procs, runs, tmux
from backends.hosts import CommandResult, HostError, LocalHost
from backends.own_session import own_sessions
from tests.backends.test_kill import FAKE_SMI
from tests.backends.test_runs import PY, eventually, host, tmux_dir, written  # noqa: F401 (fixtures)

TRACKSIDE = str(Path(sys.executable).parent / "trackside")


def tmux_out(*args: str) -> str:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def two_sessions(tmux_dir):
    """Sessions `mine` (a shell with a sleeping child) and `other`: (pane pid, pane id) each."""
    for name in ("mine", "other"):
        subprocess.run(["tmux", "new-session", "-d", "-s", name, "sh", "-c", "sleep 600 & wait"], check=True)
    return {name: tuple(tmux_out("list-panes", "-t", f"={name}:", "-F", "#{pane_pid} #{pane_id}").split()) for name in ("mine", "other")}


def tmux_env(pane_id: str) -> dict[str, str]:
    """$TMUX and $TMUX_PANE as tmux sets them in that pane of this test's server."""
    return {"TMUX": tmux_out("display-message", "-p", "#{socket_path},#{pid},0"), "TMUX_PANE": pane_id}


async def test_a_process_in_a_panes_tree_makes_that_session_its_own(host, two_sessions):
    panes = await tmux.list_panes(host)
    pane_pid = int(two_sessions["mine"][0])
    sleeper = await eventually(lambda: Path(f"/proc/{pane_pid}/task/{pane_pid}/children").read_text().split())
    assert await own_sessions(host, panes, pid=pane_pid, env={}) == {"mine"}
    assert await own_sessions(host, panes, pid=int(sleeper[0]), env={}) == {"mine"}
    assert await own_sessions(host, panes, env={}) == set()  # this test's process: in no pane


async def test_tmux_pane_counts_on_its_own_server_only(host, two_sessions, tmp_path):
    panes = await tmux.list_panes(host)
    env = tmux_env(two_sessions["other"][1])
    assert await own_sessions(host, panes, env=env) == {"other"}
    # The same pane id on another server (another -L socket, say) is another pane.
    elsewhere = {**env, "TMUX": str(tmp_path / "another-server") + ",1,0"}
    assert await own_sessions(host, panes, env=elsewhere) == set()
    assert await own_sessions(host, panes, env={"TMUX_PANE": env["TMUX_PANE"]}) == set()


async def test_listed_as_this_dashboard_and_refused_by_the_plan(host, two_sessions, monkeypatch):
    for name, value in tmux_env(two_sessions["mine"][1]).items():
        monkeypatch.setenv(name, value)
    listed = {r.session: r.this_dashboard for r in await runs.list_runs(host)}
    assert listed == {"mine": True, "other": False}
    with pytest.raises(kill.SelfKill, match="^refusing to stop mine: this trackside runs in its tmux session mine$"):
        await kill.plan_kill(host, "mine", smi=FAKE_SMI, nvml=False)


@pytest.mark.parametrize("tmux_vars", ["kept", "dropped"])
async def test_trackside_kill_of_its_own_session_exits_2_and_the_session_lives(host, tmux_dir, tmp_path, runs_root, tmux_vars):
    config = tmp_path / "config.toml"
    config.write_text(f"[hosts.box]\nruns_root = {json.dumps(runs_root)}\nnvidia_smi = {json.dumps(FAKE_SMI)}\n")
    # Dropped: only our process in the pane's tree can tell.
    unset = ["-u", "TMUX", "-u", "TMUX_PANE"] if tmux_vars == "dropped" else []
    # The pane's shell runs the CLI, records what it said, then stays: the session is `self`.
    script = 'f=$1; shift; "$@" > "$f.out" 2> "$f.err"; echo $? > "$f.code"; exec sleep 600'
    command = ["env", *unset, TRACKSIDE, "kill", "self", "--config", str(config)]
    subprocess.run(["tmux", "new-session", "-d", "-s", "self", "sh", "-c", script, "sh", str(tmp_path / "x"), *command], check=True)
    code, out, err = (tmp_path / f"x.{name}" for name in ("code", "out", "err"))
    assert (await eventually(lambda: written(code), timeout=30)).strip() == "2", written(err)
    assert written(err) == "trackside: refusing to stop self: this trackside runs in its tmux session self\n"
    assert written(out) == ""
    assert tmux_out("list-panes", "-t", "=self:", "-F", "#{pane_dead}") == "0"


async def test_a_host_without_a_process_table_still_lists_runs_and_kills_nothing(host, two_sessions, monkeypatch):
    class NoProc(LocalHost):  # a BSD's: no /proc/PID/stat to read
        async def run(self, argv, **kwargs):
            if argv == ["sh", "-c", procs._READ_STAT]:
                return CommandResult(2, "", "grep: /proc/[0-9]*/stat: No such file or directory")
            return await super().run(argv, **kwargs)

    bsd = NoProc(runs_root=host.runs_root)
    for name, value in tmux_env(two_sessions["other"][1]).items():
        monkeypatch.setenv(name, value)
    assert {r.session: r.this_dashboard for r in await runs.list_runs(bsd)} == {"mine": False, "other": True}
    with pytest.raises(HostError, match=r"cannot read /proc: grep: /proc/\[0-9\]\*/stat: No such file or directory"):
        await kill.plan_kill(bsd, "mine", smi=FAKE_SMI, nvml=False)
