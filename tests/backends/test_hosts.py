"""LocalHost and the Host API shared by every host."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import uuid
from pathlib import Path

import pytest

from backends import alerts
from backends.hosts import HostError, LocalHost
from training.handover import alive


async def test_run_returns_status_and_output():
    result = await LocalHost().run(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (result.returncode, result.stdout, result.stderr) == (3, "out\n", "err\n")


async def test_run_missing_command_is_127():
    result = await LocalHost().run(["trackside-no-such-command"])
    assert result.returncode == 127


async def test_run_timeout_raises_host_error():
    with pytest.raises(HostError, match="timed out"):
        await LocalHost().run(["sleep", "5"], timeout=0.2)


async def cancel(task: asyncio.Task, times: int) -> None:
    # Again while the first cancellation's clean-up runs: a worker being stopped as the app
    # quits is cancelled by trackside and again by Textual.
    for _ in range(times):
        task.cancel()
        await asyncio.sleep(0)


@pytest.mark.parametrize("how", ["timeout", "cancel", "cancel twice"])
async def test_a_command_does_not_outlive_its_call(tmp_path, how):
    pid_file = tmp_path / "pid"
    call = asyncio.ensure_future(LocalHost().run(
        ["sh", "-c", f"echo $$ > {pid_file}; exec sleep 60"], timeout=1.0))
    while not pid_file.exists() or not pid_file.read_text().strip():
        await asyncio.sleep(0.02)
    await cancel(call, {"timeout": 0, "cancel": 1, "cancel twice": 2}[how])
    with pytest.raises(asyncio.CancelledError if how != "timeout" else HostError):
        await call
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)


def live_processes_marked(marker: str) -> list[int]:
    """The processes not yet ended whose command line holds marker."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path("/proc", entry, "cmdline").read_bytes()
        except OSError:
            continue  # one that ended as it was read
        if marker.encode() in cmdline and alive(int(entry)):
            found.append(int(entry))
    return found


def sigkill_pending(pid: int) -> bool:
    """Whether a SIGKILL sent to pid waits for it to run (it dies as it does)."""
    status = dict(line.split(":", 1) for line in Path("/proc", str(pid), "status").read_text().splitlines() if ":" in line)
    return any(int(status[mask], 16) & 1 << (signal.SIGKILL - 1) for mask in ("SigPnd", "ShdPnd"))


async def read_to_the_end(stream) -> None:
    async for _ in stream:
        pass


CALLS = {  # every way the dashboard runs a command on this machine
    "run": lambda argv: LocalHost().run(argv, timeout=60),
    "lines": lambda argv: read_to_the_end(LocalHost().lines(argv)),
    "alert command": lambda argv: alerts.run_command(argv, alerts.Alert("lost:h", "h lost"), 0.0),
}


@pytest.mark.parametrize("call", CALLS)
async def test_a_command_cancelled_at_any_moment_of_its_start_ends_at_once_with_all_it_started(call):
    # Cancelled while asyncio still connected its pipes, asyncio killed the shell alone and
    # waited for its pipes, which the shell's child held for its 30 s; a turn later, the
    # child lived on after the call had returned. Each turn of the loop is one moment.
    for turns in range(16):
        marker = f"trackside-test-{uuid.uuid4().hex}"
        # the shell's child is a shell of its own named by the marker, which sleeps
        task = asyncio.ensure_future(CALLS[call](["sh", "-c", 'sh -c "sleep 30; :" "$1" & wait', "sh", marker]))
        for _ in range(turns):
            await asyncio.sleep(0)
        began = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert time.monotonic() - began < 5, f"cancelled after {turns} turns, it waited for the child"
        async with asyncio.timeout(10):  # a SIGKILLed process ends within milliseconds
            while live_processes_marked(marker):
                await asyncio.sleep(0.02)


@pytest.mark.parametrize("call", ["run", "alert command"])
async def test_a_command_that_ended_leaving_a_child_on_its_pipes_has_that_child_killed_at_the_timeout(call):
    marker = f"trackside-test-{uuid.uuid4().hex}"
    argv = ["sh", "-c", 'sh -c "sleep 30; :" "$1" & exit 0', "sh", marker]  # the child holds stdout and stderr
    try:
        async with asyncio.timeout(20):
            if call == "run":
                with pytest.raises(HostError, match="timed out"):
                    await LocalHost().run(argv, timeout=0.5)
            else:
                said = await alerts.run_command(argv, alerts.Alert("lost:h", "h lost"), 0.0, timeout_s=0.5)
                assert said.endswith("did not finish within 0.5s: killed")
            while live_processes_marked(marker):  # a SIGKILLed process ends within milliseconds
                await asyncio.sleep(0.02)
    finally:
        for pid in live_processes_marked(marker):
            os.kill(pid, signal.SIGKILL)


async def test_a_stream_read_to_its_end_leaves_what_its_command_started_in_the_background():
    marker = f"trackside-test-{uuid.uuid4().hex}"
    argv = ["sh", "-c", 'echo hi; sh -c "sleep 30; :" "$1" >/dev/null 2>&1 &', "sh", marker]
    try:
        for _ in range(10):  # the shell's end and the stream's: either may come first
            assert [line async for line in LocalHost().lines(argv)] == ["hi"]
        untouched = [pid for pid in live_processes_marked(marker) if not sigkill_pending(pid)]
        assert len(untouched) == 10
    finally:
        for pid in live_processes_marked(marker):
            os.kill(pid, signal.SIGKILL)


# A command's own child that outlives it keeps its pipes open: a shell's command past a
# timeout, or what a container prefix (`pct exec`) started. The call ends with its command,
# not with that child (backends/hosts/local.py, `reaped`).
HOLDS_THE_PIPE_S = 120


async def test_a_timeout_returns_while_the_commands_child_still_holds_its_output(tmp_path):
    pid_file = tmp_path / "pid"
    try:
        async with asyncio.timeout(HOLDS_THE_PIPE_S / 2):
            with pytest.raises(HostError, match="timed out"):
                await LocalHost().run(["sh", "-c", f"sleep {HOLDS_THE_PIPE_S} & echo $! > {pid_file}; wait; echo late"],
                                      timeout=0.5)  # fmt: skip
    finally:
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)  # the test's own, left to end on its own by the call


async def test_a_timeout_returns_while_the_commands_child_holds_input_it_never_reads(tmp_path):
    pid_file = tmp_path / "pid"
    inner = f'echo $$ > {pid_file}; exec sleep {HOLDS_THE_PIPE_S}'  # reads none of its stdin
    try:
        async with asyncio.timeout(HOLDS_THE_PIPE_S / 2):
            with pytest.raises(HostError, match="timed out"):  # more input than a pipe holds
                await LocalHost().run(["sh", "-c", 'sh -c "$1"; echo late', "sh", inner], input="x" * 300_000, timeout=0.5)
    finally:
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


async def test_a_stream_closed_while_the_commands_child_writes_on_returns_and_that_child_ends(tmp_path):
    pid_file = tmp_path / "pid"
    # head is the shell's child: it writes on into a pipe nobody reads once the stream is closed
    argv = ["sh", "-c", f'yes | head -c 100000000 & echo $! > {pid_file}; wait; echo late']
    async with asyncio.timeout(HOLDS_THE_PIPE_S / 2):
        async with contextlib.aclosing(LocalHost().chunks(argv)) as chunks:
            await anext(chunks)
            while not pid_file.exists() or not pid_file.read_text().endswith("\n"):
                await asyncio.sleep(0.02)
    head = int(pid_file.read_text())
    async with asyncio.timeout(HOLDS_THE_PIPE_S / 2):  # its pipe is broken: it ends at its next write
        while alive(head):
            await asyncio.sleep(0.05)


async def test_lines_yields_lines_and_a_last_partial_one():
    lines = [line async for line in LocalHost().lines(["printf", "a\nb\n\nc"])]
    assert lines == ["a", "b", "", "c"]


async def test_a_stream_cancelled_twice_has_ended_its_process_when_it_returns():
    started = asyncio.get_running_loop().create_future()

    async def consume() -> None:
        async for line in LocalHost().lines(["sh", "-c", "echo $$; exec sleep 60"]):
            started.set_result(int(line))

    task = asyncio.create_task(consume())
    pid = await started
    await cancel(task, 2)
    with pytest.raises(asyncio.CancelledError):
        await task
    with pytest.raises(ProcessLookupError):  # reaped, not left for the loop's close
        os.kill(pid, 0)


async def test_closing_lines_ends_the_process():
    stream = LocalHost().lines(["sh", "-c", "echo $$; exec sleep 60"])
    async with contextlib.aclosing(stream):
        pid = int(await anext(stream))
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_shell_command_quotes_each_argument_once():
    host = LocalHost(prefix=["pct", "exec", "129", "--"])
    assert host.shell_command(["echo", "a b", "$(id)"]) == "pct exec 129 -- echo 'a b' '$(id)'"


@pytest.mark.parametrize("argv", [[], ["ok", 3], ["nul\x00byte"]])
def test_bad_argv_is_refused(argv):
    with pytest.raises((TypeError, ValueError)):
        LocalHost().shell_command(argv)


async def test_every_host_names_its_tmux_server_and_tmux_runs_there(tmp_path):
    """`Host.tmux_socket`: None for the user's default server, where sessions trackside did
    not launch live; set, a server of its own, which every tmux command then uses."""
    from backends import tmux
    from backends.hosts import SSHHost
    from scripts.local_box import end_tmux_server

    assert LocalHost().tmux_socket is None and SSHHost("box", "127.0.0.1").tmux_socket is None
    host = LocalHost()
    host.tmux_socket = f"trackside-host-{os.getpid()}"
    try:
        await tmux.new_session(host, "named", ["sleep", "60"], f"cat > {tmp_path / 'pane.log'}")
        assert await tmux.list_sessions(host) == ["named"]
        assert "named" not in await tmux.list_sessions(LocalHost())
    finally:
        end_tmux_server("tmux", "-L", host.tmux_socket)


async def test_on_reach_comes_before_the_first_command_and_beside_a_later_one(monkeypatch):
    """The first command waits for the host's `on_reach` (the recorder started before it
    runs); a later one, REACH_AGAIN_S on, runs it again beside itself: a check held up by
    a slow host never holds up the command (a kill)."""
    from backends.hosts import base

    monkeypatch.setattr(base, "REACH_AGAIN_S", 0.0)
    host, calls, release = LocalHost(), [], asyncio.Event()

    async def hook(h):
        calls.append(len(calls))
        await h.run(["true"])  # its own commands go on without it
        if len(calls) > 1:
            await release.wait()  # the later check: a host that does not answer

    host.on_reach = hook
    assert (await host.run(["echo", "first"])).stdout == "first\n" and calls == [0]
    async with asyncio.timeout(10):
        assert (await host.run(["echo", "second"])).stdout == "second\n"
    await asyncio.sleep(0)
    assert calls == [0, 1] and host._reaching  # still checking; the command is done
    assert (await host.run(["echo", "third"])).stdout == "third\n" and calls == [0, 1]  # one check at a time
    release.set()
    await host._reach_again
    assert not host._reaching
