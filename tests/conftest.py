"""Shared fixtures: a real OpenSSH sshd on 127.0.0.1 (`sshd`, shared by the session;
`fresh_sshd`, a private one for tests that stop or sever it), an SSHHost pointed at the
shared one (`ssh_host`), and a temporary runs root (`runs_root`)."""

from __future__ import annotations

import os

# One thread per torch: two test workers on two cores already fill the machine, and each
# trainer a test starts (in tmux, inheriting this) would otherwise spread over both cores
# against the workers. Set before anything imports torch.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402

from tests.sshd import Sshd, sshd_available


def need_sshd() -> None:
    if not sshd_available():
        pytest.skip("OpenSSH sshd is not installed (/usr/sbin/sshd); SSH tests need a real server")


@pytest.fixture(scope="session")
def sshd(tmp_path_factory):
    """The session's sshd (see tests/sshd.py). Tests that stop or sever it restart it."""
    need_sshd()
    server = Sshd(tmp_path_factory.mktemp("sshd"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def fresh_sshd(tmp_path):
    """A started sshd of this test's own (new port and keys), stopped after it."""
    need_sshd()
    server = Sshd(tmp_path / "sshd")
    server.start()
    yield server
    server.stop()


@pytest.fixture
async def ssh_host(sshd):
    """An SSHHost on the session's sshd; its connection is closed after the test."""
    if not sshd.running:
        sshd.start()
    host = sshd.host()
    yield host
    await host.close()


@pytest.fixture
def runs_root(tmp_path):
    """A fresh runs root directory (absolute path, as a str) for run directories."""
    root = tmp_path / "runs"
    root.mkdir()
    return str(root)


# Lines a test records as `record_property("summary", …)` (the monkey tests' seed, key
# count and duration), printed at the end of the run: with or without xdist workers.
SUMMARIES: list[str] = []


def pytest_runtest_logreport(report):
    if report.when == "call":
        SUMMARIES.extend(str(value) for name, value in report.user_properties if name == "summary")


def pytest_terminal_summary(terminalreporter):
    if SUMMARIES:
        terminalreporter.section("summaries")
        for line in SUMMARIES:
            terminalreporter.write_line(line)


def end_tmux_server(*tmux: str) -> None:
    """Kill a test's tmux server and what its panes run. Run panes start under an sh that
    traps SIGHUP (backends/runs/launch.py), and a program that outlives the hangup would go on
    after the test: each pane's process group is killed first (a pane is a session
    leader, its program in its group)."""
    import os
    import signal
    import subprocess

    panes = subprocess.run([*tmux, "list-panes", "-a", "-F", "#{pane_pid}"], capture_output=True, text=True)
    for pid in panes.stdout.split():
        try:
            os.killpg(int(pid), signal.SIGKILL)
        except (ProcessLookupError, PermissionError, ValueError):
            pass
    subprocess.run([*tmux, "kill-server"], capture_output=True)

