"""SSHHost against a real OpenSSH sshd on 127.0.0.1 (tests/sshd.py)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import subprocess
import time
from pathlib import Path

import pytest

from backends.hosts import AuthFailed, HostError, HostKeyRejected, HostUnreachable, SSHHost
from tests.waiting import wait_until

# Runs the rest of argv as it is, as `pct exec 129 --` or `docker exec NAME` do in a container.
CONTAINER_PREFIX = ["sh", "-c", 'exec "$@"', "container"]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_run_output_status_input_and_home(ssh_host):
    result = await ssh_host.run(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (result.returncode, result.stdout, result.stderr) == (3, "out\n", "err\n")
    assert (await ssh_host.run(["cat"], input="fed to stdin\n")).stdout == "fed to stdin\n"
    assert (await ssh_host.run(["sh", "-c", "kill -9 $$"])).returncode == -9
    assert (await ssh_host.run(["trackside-no-such-command"])).returncode == 127
    assert await ssh_host.home() == os.path.expanduser("~")


async def test_the_project_venv_runs_over_ssh(sshd, ssh_host):
    result = await ssh_host.run([str(sshd.python), "-c", "import sys, training, backends; print(sys.prefix)"])
    assert result.ok, result.stderr
    assert result.stdout.strip() == str(sshd.python.parent.parent)


async def test_lines_and_closing_them_ends_the_remote_process(ssh_host):
    assert [line async for line in ssh_host.lines(["printf", "a\nb\n\nc"])] == ["a", "b", "", "c"]
    stream = ssh_host.lines(["sh", "-c", "echo $$; exec sleep 60"])
    async with contextlib.aclosing(stream):
        pid = int(await anext(stream))
        assert pid_alive(pid)
    await wait_until(lambda: not pid_alive(pid), 10, "the remote sleep to end")


def pids_running(token: str) -> list[int]:
    """PIDs of processes with `token` as an argument."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            if token.encode() in cmdline.read_bytes().split(b"\0"):
                found.append(int(cmdline.parent.name))
    return found


async def test_timeout_raises_and_ends_the_remote_process(ssh_host):
    token = f"{secrets.randbelow(10**6) + 10**6}.5"  # a unique `sleep` duration to find it by
    command = asyncio.create_task(ssh_host.run(["sleep", token], timeout=5))
    await wait_until(lambda: pids_running(token), 5, "the remote sleep to start")
    with pytest.raises(HostError, match="timed out after 5s"):
        await command
    await wait_until(lambda: not pids_running(token), 10, "the timed-out command to end")


# -- host keys and credentials ------------------------------------------------------------


async def test_unknown_host_key_is_refused_naming_the_host(sshd, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    for known_hosts in (empty, tmp_path / "absent"):
        host = sshd.host("gpu-box", known_hosts=str(known_hosts))
        with pytest.raises(HostKeyRejected) as error:
            await host.run(["touch", str(tmp_path / "ran")])
        message = str(error.value)
        assert message.startswith("gpu-box: ")
        assert f"[127.0.0.1]:{sshd.port}" in message and "is not in" in message
        assert "ssh-keyscan" in message
    assert not (tmp_path / "ran").exists()


async def test_changed_host_key_is_refused_naming_the_host(sshd, tmp_path):
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    algorithm, key = Path(f"{other}.pub").read_text().split()[:2]
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{sshd.port} {algorithm} {key}\n")
    host = sshd.host("gpu-box", known_hosts=str(known_hosts))
    with pytest.raises(HostKeyRejected) as error:
        await host.run(["touch", str(tmp_path / "ran")])
    message = str(error.value)
    assert message.startswith("gpu-box: ")
    assert f"[127.0.0.1]:{sshd.port}" in message and "does not match" in message
    assert not (tmp_path / "ran").exists()


async def test_unknown_client_key_is_auth_failed(sshd, tmp_path):
    stranger = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    host = sshd.host("gpu-box", client_keys=[str(stranger)])
    with pytest.raises(AuthFailed, match=r"^gpu-box: root@127\.0\.0\.1:\d+ refused our keys"):
        await host.run(["true"])


async def test_closed_port_is_unreachable_then_fails_fast_until_the_retry(tmp_path):
    with socket_port() as port:
        pass  # nothing listens on it any more
    host = SSHHost("gpu-box", "127.0.0.1", port=port, known_hosts=str(tmp_path / "kh"), connect_timeout=2)
    with pytest.raises(HostUnreachable, match=rf"^gpu-box: cannot connect to 127\.0\.0\.1:{port}"):
        await host.run(["true"])
    with pytest.raises(HostUnreachable, match=r"next attempt in"):
        await host.run(["true"])


async def test_a_server_that_never_answers_times_out(tmp_path):
    silent = await asyncio.start_server(lambda reader, writer: None, "127.0.0.1", 0)
    port = silent.sockets[0].getsockname()[1]
    host = SSHHost("gpu-box", "127.0.0.1", port=port, known_hosts=str(tmp_path / "kh"), connect_timeout=0.5)
    started = time.monotonic()
    try:
        with pytest.raises(HostUnreachable, match=rf"^gpu-box: cannot connect to 127\.0\.0\.1:{port}: no answer within 0.5s"):
            await host.run(["true"])
    finally:
        silent.close()
    assert time.monotonic() - started < 5


@contextlib.contextmanager
def socket_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


# -- quoting ------------------------------------------------------------------------------


def hostile_arguments(marker: Path) -> list[str]:
    return [
        f"8192; touch {marker}",
        f"$(touch {marker})",
        f"`touch {marker}`",
        f"x && touch {marker} || touch {marker}",
        f"> {marker}",
        "$(id)",
        "${HOME}",
        "line one\nline two",
        "it's",
        '"double"',
        "back\\slash",
        "tab\there",
        "*",
        "~",
        "",
        "  spaced  ",
        "-n",
        "ünïcødé ✓",
    ]


@pytest.mark.parametrize("prefix", [[], CONTAINER_PREFIX], ids=["plain", "prefixed"])
@pytest.mark.parametrize("via", ["run", "run-with-input", "lines"])
async def test_arguments_arrive_as_one_literal_argument(sshd, prefix, via):
    marker = Path(f"/tmp/pwned-{secrets.token_hex(6)}")
    arguments = hostile_arguments(marker)
    host = sshd.host(prefix=prefix)
    argv = [str(sshd.python), "-c", "import sys; print(repr(sys.argv[1:]))", *arguments]
    try:
        if via == "lines":
            output = "\n".join([line async for line in host.lines(argv)])
        else:
            result = await host.run(argv, input="" if via == "run-with-input" else None)
            assert result.ok, result.stderr
            output = result.stdout
    finally:
        await host.close()
    assert eval(output) == arguments
    assert not marker.exists()


# -- one connection, many channels --------------------------------------------------------


async def test_concurrent_runs_share_one_connection_within_max_channels(sshd):
    host = sshd.host(max_channels=4)
    # Each command reports its parent (the sshd process serving the connection) and when
    # it ran, so the server side shows how many connections and channels there were.
    argv = ["sh", "-c", 'echo "$PPID $(date +%s.%N)"; sleep 0.8; date +%s.%N']
    try:
        results = await asyncio.gather(*(host.run(argv) for _ in range(12)))
    finally:
        await host.close()
    assert all(r.ok for r in results)
    parents = {r.stdout.split()[0] for r in results}
    assert len(parents) == 1 and host.connects == 1
    spans = [(float(r.stdout.split()[1]), float(r.stdout.split()[2])) for r in results]
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    running = peak = 0
    for _, change in events:
        running += change
        peak = max(peak, running)
    assert 1 < peak <= 4  # concurrent, and never more than max_channels


async def test_streams_leave_channels_to_commands(sshd):
    host = sshd.host(max_channels=2)  # streams get 1 (at least one, whatever the budget)
    streams = [host.lines(["sh", "-c", f"echo {i}; exec sleep 60"]) for i in range(2)]
    try:
        assert await anext(streams[0]) == "0"
        second = asyncio.ensure_future(anext(streams[1]))  # waits for the first to close
        # Two streams would otherwise hold both channels; commands still run.
        results = await asyncio.wait_for(asyncio.gather(*(host.run(["true"]) for _ in range(4))), 10)
        assert all(r.ok for r in results) and not second.done()
        await streams[0].aclose()
        assert await asyncio.wait_for(second, 10) == "1"
    finally:
        for stream in streams:
            await stream.aclose()
        await host.close()


# -- reconnecting, jump hosts, ~/.ssh/config ----------------------------------------------


async def test_reconnects_on_the_next_call_after_a_drop(fresh_sshd):
    server = fresh_sshd
    host = server.host(backoff_cap=0.5)
    try:
        assert (await host.run(["echo", "one"])).stdout == "one\n"
        server.sever()
        await wait_until(lambda: host._conn is None or host._conn.is_closed(), 5, "the drop to be seen")
        assert (await host.run(["echo", "two"])).stdout == "two\n"
        assert host.connects == 2
        server.stop()
        with pytest.raises(HostUnreachable, match="^sshd: "):
            await host.run(["true"])
        server.start()
        deadline = time.monotonic() + 10
        while True:
            try:
                assert (await host.run(["echo", "three"])).stdout == "three\n"
                break
            except HostUnreachable:
                assert time.monotonic() < deadline, "did not reconnect within 10 s"
                await asyncio.sleep(0.1)
        assert host.connects == 3
    finally:
        await host.close()


def own_tcp_ports() -> set[int]:
    """Local ports of the TCP sockets this test process holds."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    ports = set()
    for row in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = row.split()
        if fields[9] in inodes:
            ports.add(int(fields[1].split(":")[1], 16))
    return ports


async def client_port(host: SSHHost) -> int:
    """The source port of the host's connection, as the server saw it."""
    return int((await host.run(["sh", "-c", "echo $SSH_CLIENT"])).stdout.split()[1])


async def test_jump_host_carries_the_connection(sshd):
    direct = sshd.host("direct")
    jump = sshd.host("bastion")
    host = sshd.host("gpu-box", jump=jump)
    try:
        assert (await host.run(["echo", "via bastion"])).stdout == "via bastion\n"
        assert jump.connects == 1 and host.connects == 1
        # A direct connection comes from a socket of ours; the jumped one from the
        # bastion's sshd, which opened it for the forwarded channel.
        assert await client_port(direct) in own_tcp_ports()
        assert await client_port(host) not in own_tcp_ports()
        assert await client_port(jump) in own_tcp_ports()
    finally:
        for h in (host, jump, direct):
            await h.close()


async def test_jump_host_errors_name_both_hosts(sshd, tmp_path):
    jump = sshd.host("bastion", known_hosts=str(tmp_path / "absent"))
    host = sshd.host("gpu-box", jump=jump)
    with pytest.raises(HostKeyRejected, match="^gpu-box: via jump host bastion: host key"):
        await host.run(["true"])


async def test_ssh_config_supplies_port_user_and_key(sshd, tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(
        f"Host trackside-test-box\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User {sshd.user}\n"
        f"  IdentityFile {sshd.client_key}\n"
    )
    monkeypatch.setenv("HOME", str(home))
    host = SSHHost("box", "trackside-test-box", known_hosts=str(sshd.known_hosts), connect_timeout=5)
    try:
        assert (await host.run(["echo", "configured"])).stdout == "configured\n"
    finally:
        await host.close()
