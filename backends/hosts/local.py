"""This machine as a host: each argv run with an asyncio subprocess, never outliving
the call."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import signal
from collections.abc import Sequence

from backends.hosts.base import (
    CHUNK_BYTES,
    DEFAULT_RUNS_ROOT,
    CommandResult,
    Host,
    HostError,
)


class LocalHost(Host):
    def __init__(self, name: str = "local", *, prefix: Sequence[str] = (), runs_root: str = DEFAULT_RUNS_ROOT):
        super().__init__(name, prefix=prefix, runs_root=runs_root)

    @property
    def is_local(self) -> bool:
        return not self.prefix

    async def run(self, argv, *, input=None, timeout=30.0):
        full = self.full_argv(argv)
        await self.reached()
        try:
            proc, pidfd = await started(
                full,
                stdin=asyncio.subprocess.PIPE if input is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except FileNotFoundError:
            return CommandResult(127, "", f"{full[0]}: command not found")
        done = False
        try:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for returns the result of a
            # command that ended as the call was cancelled, losing the cancellation (a
            # Ctrl-C during `trackside demo`'s stop then waited out the whole grace).
            async with asyncio.timeout(timeout):
                out, err = await proc.communicate(input.encode() if input is not None else None)
            done = True
        except TimeoutError:
            raise HostError(self.name, f"command timed out after {timeout}s: {shlex.join(full)}") from None
        finally:
            # Timed out or cancelled (a monitor stopping, the app quitting): the command
            # must not outlive the call, nor its pipes be left for the loop's close.
            await killed(proc, pidfd, early=not done)
        return CommandResult(proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"))

    async def chunks(self, argv):
        full = self.full_argv(argv)
        await self.reached()
        try:
            proc, pidfd = await started(
                full,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL,
            )
        except FileNotFoundError:
            raise HostError(self.name, f"{full[0]}: command not found")
        done = False
        try:
            assert proc.stdout is not None
            while chunk := await proc.stdout.read(CHUNK_BYTES):
                yield chunk
            done = True
        finally:
            await killed(proc, pidfd, early=not done)


async def started(argv: Sequence[str], **pipes) -> tuple[asyncio.subprocess.Process, int | None]:
    """argv run in a session of its own, its pipes as create_subprocess_exec takes them,
    and a pidfd on it (`_pidfd`). A cancellation does not cut its start short: asyncio's
    clean-up of a start cancelled midway kills the process alone (a shell's child lived
    on) and waited for its pipes, which such a child holds for as long as it lives. A
    cancellation meanwhile waits for the start, then kills what started (`killed`) and
    is raised."""
    start = asyncio.ensure_future(asyncio.create_subprocess_exec(*argv, start_new_session=True, **pipes))
    try:
        proc = await asyncio.shield(start)
    except asyncio.CancelledError as error:
        cancelled = error
        while not start.done():
            try:
                await asyncio.wait({start})
            except asyncio.CancelledError as again:
                cancelled = again
        if not start.cancelled() and start.exception() is None:
            proc = start.result()
            await killed(proc, _pidfd(proc), early=True)
        raise cancelled from None
    return proc, _pidfd(proc)


def _pidfd(proc: asyncio.subprocess.Process) -> int | None:
    """A pidfd on proc, taken as it starts: a signal through it reaches this process or
    none, never another that reused its pid. None if it is gone already or this kernel
    has no pidfds (before Linux 5.3)."""
    try:
        return os.pidfd_open(proc.pid)
    except OSError:
        return None


async def killed(proc: asyncio.subprocess.Process, pidfd: int | None, *, early: bool) -> None:
    """Kill proc if it still runs and, where the call leaves before the command is done
    (a timeout, a cancellation, a stream closed before its end), the rest of its process
    group: what a shell it runs started. Then reap it (`reaped`) and close pidfd. A
    command that is done keeps what it left running in the background.

    The signal is never sent through proc.kill(): Popen.send_signal polls first, and that
    poll reaps a process that has just ended ahead of asyncio's child watcher, which then
    logs "Unknown child process pid N, will report returncode 255" on stderr (and reports
    255). The watcher stays the only one to reap; a process it reaped already is not
    signalled (ESRCH). The group's id is the leader's pid (start_new_session), which the
    kernel gives out again only once nothing of the group lives: as the call leaves early,
    what holds its pipes still runs, or ended a moment before."""
    try:
        if proc.returncode is None and pidfd is not None:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        elif proc.returncode is None:  # no pidfd: the pid, as Popen would, without its poll
            os.kill(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # it ended on its own; the watcher has its status
    finally:
        if pidfd is not None:
            os.close(pidfd)
    if early:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    await reaped(proc)


async def reaped(proc: asyncio.subprocess.Process) -> None:
    """Close this side of a signalled process's pipes and wait for its end, even through
    further cancellations (a worker cancelled again while it cleans up, as the app quits):
    a process left unreaped when the event loop closes is reported as an error, its pipes
    collected without a loop. A SIGKILLed process is reaped within milliseconds; a
    cancellation that arrived meanwhile is raised afterwards.

    The pipes are closed first: asyncio's proc.wait() (Python 3.11 to 3.13 at least), when
    the process still runs as it is called, waits for every other holder of them to let
    go too, so a command's own child still running (a shell's `sleep`, past a timeout; one
    in a session of its own, which a group's kill misses) or blocked writing to a pipe
    nobody reads any more held the caller for as long as it lived: a monitor's stop, and
    the dashboard's exit with it, forever. Such a child is left to end on its own (one
    still writing, at once: its pipe is broken)."""
    # The pipes' transports (asyncio's Process names none but through its private
    # `_transport`), not the process's: closing that polls, and reaps as above.
    for fd in (0, 1, 2):
        if (pipe := proc._transport.get_pipe_transport(fd)) is None:
            continue
        if fd == 0 and pipe.get_write_buffer_size():
            pipe.abort()  # input still unread: close() would wait for the child to read it
        else:
            pipe.close()
    cancelled = None
    while True:
        try:
            await proc.wait()
            break
        except asyncio.CancelledError as error:
            cancelled = error
    if cancelled is not None:
        raise cancelled
