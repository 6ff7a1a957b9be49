"""The tests own every process and file they make, whatever the environment (issue 32,
item 14): the session's HOME and tmux directory are its own (tests/conftest.py), on this
side and in the test sshd's sessions alike, so a tmux server a test starts over SSH is the
one its cleanup ends, and nothing lands in the user's home."""

from __future__ import annotations

import os
import pwd
import uuid

from backends import tmux
from backends.logs import recording
from scripts.local_box import end_tmux_server


async def test_ssh_sessions_get_the_sessions_own_home_and_tmux_dir(ssh_host):
    result = await ssh_host.run(["sh", "-c", 'printf "%s\\n%s\\n" "$HOME" "$TMUX_TMPDIR"'])
    home, tmux_dir = result.stdout.splitlines()
    assert (home, tmux_dir) == (os.environ["HOME"], os.environ["TMUX_TMPDIR"])
    real = pwd.getpwuid(os.getuid()).pw_dir
    assert not (home + "/").startswith(real.rstrip("/") + "/"), f"the tests' HOME {home} is the user's ({real})"


async def test_a_tmux_server_started_over_ssh_is_ended_by_the_tests_cleanup(ssh_host, tmp_path):
    ssh_host.tmux_socket = f"trackside-hygiene-{uuid.uuid4().hex[:8]}"
    try:
        await tmux.new_session(ssh_host, "lingers", ["sleep", "600"], recording.recorder(str(tmp_path / "console.log")))
        assert await tmux.list_sessions(ssh_host) == ["lingers"]
    finally:
        end_tmux_server("tmux", "-L", ssh_host.tmux_socket)  # as tests/tui/conftest.py's tmux_socket does
    still = await ssh_host.run(["tmux", "-L", ssh_host.tmux_socket, "list-sessions"])
    assert not still.ok, f"the server started over SSH outlived the cleanup: {still.stdout}"
