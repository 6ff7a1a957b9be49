"""The argv behind the dashboard's `a`: tmux attach locally, `ssh -t` with the host's own
settings remotely, the container prefix inside the remote command, quoted once."""

import os
import shlex
import subprocess
import sys
import time
import uuid

import pytest

from backends.attach import attach_argv
from backends.hosts import LocalHost, SSHHost


def test_local_attach_targets_the_exact_session():
    assert attach_argv(LocalHost(), "run-1") == ["tmux", "attach-session", "-t", "=run-1"]


def test_remote_attach_carries_port_key_jump_known_hosts_and_prefix():
    bastion = SSHHost("bastion", "bastion.example.org", user="ops")
    host = SSHHost(
        "gpu1", "10.0.0.5", user="root", port=2222, jump=bastion,
        known_hosts="/tmp/kh", client_keys=["/tmp/key"], prefix=["pct", "exec", "129", "--"],
    )  # fmt: skip
    argv = attach_argv(host, "it's; $(id)")
    assert argv[:2] == ["ssh", "-t"]
    options = argv[2:-2]
    assert ["-p", "2222"] == options[options.index("-p") : options.index("-p") + 2]
    assert "UserKnownHostsFile=/tmp/kh" in options and "StrictHostKeyChecking=yes" in options
    assert options[options.index("-i") + 1] == "/tmp/key"
    assert options[options.index("-J") + 1] == "ops@bastion.example.org"
    assert argv[-2] == "root@10.0.0.5"
    # The remote command is one shell string that splits back into exactly our argv.
    assert shlex.split(argv[-1]) == ["pct", "exec", "129", "--", "tmux", "attach-session", "-t", "=it's; $(id)"]


def _tmux(socket: str, *args: str) -> str:
    return subprocess.run(["tmux", "-L", socket, *args], capture_output=True, text=True, check=True).stdout


@pytest.fixture
def two_servers():
    """The dashboard's tmux server (a session `dash` with a client attached from a second,
    outer server, as a terminal would be) and the outer one; both removed afterwards."""
    inner, outer = f"ts-attach-{uuid.uuid4().hex[:6]}", f"ts-outer-{uuid.uuid4().hex[:6]}"
    _tmux(inner, "new-session", "-d", "-s", "dash", "sleep 300")
    _tmux(inner, "new-session", "-d", "-s", "run1", "sleep 300")
    yield inner, outer
    for socket in (inner, outer):
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True)


def _attach_from_inside(inner: str, session: str, tmp_path) -> str:
    """attach_inside_tmux run in a pane of the dashboard's server (so TMUX is real)."""
    out = tmp_path / "attach.out"
    code = (
        "import asyncio; from backends.attach import attach_inside_tmux; from backends.hosts import LocalHost\n"
        f"h = LocalHost(); h.tmux_socket = {inner!r}\n"
        f"try: print(asyncio.run(attach_inside_tmux(h, {session!r})))\n"
        "except Exception as e: print(type(e).__name__, e)\n"
    )
    argv = [sys.executable, "-c", code]
    script = f"cd {shlex.quote(os.getcwd())} && {shlex.join(argv)} > {shlex.quote(str(out))} 2>&1"
    _tmux(inner, "new-window", "-t", "=dash:", script)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not (out.exists() and out.read_text().strip()):
        time.sleep(0.1)
    return out.read_text()


def test_inside_tmux_attach_switches_the_dashboards_client(two_servers, tmp_path):
    inner, outer = two_servers
    _tmux(outer, "new-session", "-d", "-s", "terminal", f"env -u TMUX tmux -L {inner} attach -t =dash")
    deadline = time.monotonic() + 10
    while "dash" not in _tmux(inner, "list-clients", "-F", "#{client_session}") and time.monotonic() < deadline:
        time.sleep(0.1)
    said = _attach_from_inside(inner, "run1", tmp_path)
    assert "switched this tmux client to run1" in said
    assert _tmux(inner, "list-clients", "-F", "#{client_session}").split() == ["run1"]


def test_inside_tmux_attach_without_a_client_says_what_to_run(two_servers, tmp_path):
    inner, _ = two_servers  # nobody looks at this server: tmux has no client to switch
    said = _attach_from_inside(inner, "run1", tmp_path)
    assert said.startswith("AttachError") and "run: tmux switch-client -t =run1" in said
