"""The headless commands over every configured host: this machine, the test sshd on
127.0.0.1 (its own tmux server and runs root), and a host that cannot be reached, listed
first. Without --host, `runs` and `gpus` read every host at once (a line for the one that
cannot be read, exit 0 while any could), `kill` and `relaunch` find the run wherever it is.
"""

from __future__ import annotations

import json
import shutil
import socket
import tempfile

import pytest

from tests.backends.test_kill import FAKE_SMI
from tests.backends.test_runs import fake_trainer, tmux_dir  # noqa: F401 (fixture)
from tui.commands.headless import main

SLEEPER = ["sh", "-c", "echo step=1 loss=2.5; sleep 600"]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed once the socket is: nothing listens there


@pytest.fixture
def fleet(sshd, tmp_path, tmux_dir):  # noqa: F811
    if not sshd.running:
        sshd.start()
    remote_tmux = tempfile.mkdtemp(prefix="ts-tmux-remote-", dir="/tmp")  # the remote host's own tmux server
    config = tmp_path / "config.toml"
    train = fake_trainer(tmp_path)  # the stand-in trainer: it sleeps 30 s
    config.write_text(
        f"[defaults]\ntrain_command = {json.dumps(train)}\n"
        f'[hosts.ghost]\naddress = "127.0.0.1"\nport = {closed_port()}\nuser = "{sshd.user}"\n'
        f'known_hosts = "{sshd.known_hosts}"\nidentity_file = "{sshd.client_key}"\n'
        f"[hosts.here]\nruns_root = {json.dumps(str(tmp_path / 'here'))}\nnvidia_smi = {json.dumps(FAKE_SMI)}\n"
        f'[hosts.remote]\naddress = "{sshd.address}"\nport = {sshd.port}\nuser = "{sshd.user}"\n'
        f'known_hosts = "{sshd.known_hosts}"\nidentity_file = "{sshd.client_key}"\n'
        f"runs_root = {json.dumps(str(tmp_path / 'remote'))}\nnvidia_smi = {json.dumps(FAKE_SMI)}\n"
        f'prefix = ["env", "TMUX_TMPDIR={remote_tmux}"]\n'
    )
    yield str(config), train
    import subprocess

    subprocess.run(["env", f"TMUX_TMPDIR={remote_tmux}", "tmux", "kill-server"], capture_output=True)
    shutil.rmtree(remote_tmux, ignore_errors=True)


def run(capsys, *argv: str) -> tuple[int, object, list[str]]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out.strip() and "--json" in argv else out), err.strip().splitlines()


def test_every_host_is_read_and_a_run_is_found_wherever_it_is(fleet, capsys):
    fleet, train = fleet
    code, here, _ = run(capsys, "launch", "--host", "here", "--json", "--config", fleet, "--", *SLEEPER)
    assert code == 0
    code, there, _ = run(capsys, "launch", "--host", "remote", "--json", "--config", fleet, "--", *train, "--ttt-steps", "3")
    assert code == 0

    code, listed, err = run(capsys, "runs", "--json", "--config", fleet)
    assert code == 0 and {(r["host"], r["run_id"]) for r in listed if r["run_id"]} == {("here", here["run_id"]), ("remote", there["run_id"])}
    assert len(err) == 1 and err[0].startswith("trackside: ghost: ")  # the host that could not be read, once
    code, table, _ = run(capsys, "runs", "--config", fleet)
    rows = table.splitlines()
    assert rows[0].split()[0] == "HOST" and any(row.split()[:2] == ["remote", there["run_id"]] for row in rows)

    code, readings, err = run(capsys, "gpus", "--json", "--config", fleet)
    assert code == 0 and [r["host"] for r in readings] == ["here", "remote"] and all(r["gpus"] for r in readings)
    assert len(err) == 1 and "ghost" in err[0]

    code, again, err = run(capsys, "relaunch", there["run_id"], "--set", "ttt_steps=5", "--json", "--config", fleet)
    assert code == 0, err
    assert again["host"] == "remote" and again["parent"] == there["run_id"]
    for run_id in (there["run_id"], again["run_id"]):
        code, report, _ = run(capsys, "kill", run_id, "--json", "--config", fleet)
        assert code == 0 and report["host"] == "remote" and report["signalled"], report
    code, _, err = run(capsys, "kill", "20260101-0000-abcd", "--config", fleet)
    assert code == 1 and err == ["trackside: no run 20260101-0000-abcd on here, remote (ghost: " + err[0].split("(ghost: ", 1)[1]]


def test_no_host_could_be_read_is_exit_1_in_one_line(sshd, tmp_path, capsys):
    config = tmp_path / "config.toml"
    config.write_text(f'[hosts.ghost]\naddress = "127.0.0.1"\nport = {closed_port()}\nknown_hosts = "{sshd.known_hosts}"\n')
    code, _, err = run(capsys, "runs", "--config", str(config))
    assert code == 1 and len(err) == 1 and err[0].startswith("trackside: ghost: ")
