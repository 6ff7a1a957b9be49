"""A host: where commands run, each an argv list quoted once, here (`shell_command`),
with the host's command prefix (for containers: `pct exec 129 --`, `docker exec NAME`);
and the errors a host's trouble is told by."""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass

from training.contract import RUNS_ROOT as DEFAULT_RUNS_ROOT

CHUNK_BYTES = 1 << 16
# A command that reaches a host this long after `on_reach` last ran runs it again: a
# dashboard left open all night restarts a recorder that died, as the next command would.
REACH_AGAIN_S = 60.0


class HostError(Exception):
    """A host could not do what was asked; the message names the host."""

    def __init__(self, host: str, message: str):
        super().__init__(f"{host}: {message}")
        self.host = host
        self.reason = message


class HostUnreachable(HostError):
    """No connection could be made (refused, timed out, dropped and not yet back)."""


class HostKeyRejected(HostError):
    """The host's key is unknown to known_hosts or does not match it."""


class AuthFailed(HostError):
    """The host refused our credentials."""


@dataclass(frozen=True)
class CommandResult:
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def check_argv(argv: Sequence[str]) -> list[str]:
    """Commands are non-empty lists of strings; anything else is a programming error."""
    argv = list(argv)
    if not argv or not all(isinstance(a, str) for a in argv):
        raise TypeError(f"argv must be a non-empty list of str, got {argv!r}")
    if any("\x00" in a for a in argv):
        raise ValueError("argv items may not contain NUL bytes")
    return argv


class Host(ABC):
    """A machine that runs argv lists. Subclasses implement `run` and `chunks`."""

    # The tmux server (`tmux -L NAME`) its sessions live on: None is the user's default,
    # where the sessions trackside did not launch are; a test sets its own server's.
    tmux_socket: str | None = None
    # What the first command to reach the host does first, and a command again each
    # REACH_AGAIN_S (backends/config.py gives backends/recorder/start.py's: the host's
    # recorder started unless it runs); None: nothing.
    on_reach: Callable[[Host], Awaitable[None]] | None = None
    _reached_at: float | None = None  # time.monotonic() when on_reach last ended
    _reaching = False
    _reach_again: asyncio.Task | None = None  # the later checks' task, kept from the collector

    def __init__(self, name: str, *, prefix: Sequence[str] = (), runs_root: str = DEFAULT_RUNS_ROOT):
        self.name = name
        self.prefix = list(prefix)
        self.runs_root = runs_root

    @property
    def is_local(self) -> bool:
        return False

    async def reached(self) -> None:
        """`on_reach`: before the first command, and beside a command REACH_AGAIN_S after it
        last ended (its own commands, and those that run meanwhile, go on without it). Each
        subclass's `run` and `chunks` await it."""
        hook, last = self.on_reach, self._reached_at
        if hook is None or self._reaching or (last is not None and time.monotonic() - last < REACH_AGAIN_S):
            return
        self._reaching = True
        if last is None:
            await self._reach(hook)
        else:
            # Not before the command: a kill is never held up by a slow host's check.
            self._reach_again = asyncio.get_running_loop().create_task(self._reach(hook))

    async def _reach(self, hook: Callable[[Host], Awaitable[None]]) -> None:
        try:
            await hook(self)
        finally:
            self._reaching = False
            self._reached_at = time.monotonic()

    def full_argv(self, argv: Sequence[str]) -> list[str]:
        return self.prefix + check_argv(argv)

    def shell_command(self, argv: Sequence[str]) -> str:
        """The one place argv becomes a shell string (for SSH and tmux)."""
        return shlex.join(self.full_argv(argv))

    @abstractmethod
    async def run(
        self, argv: Sequence[str], *, input: str | None = None, timeout: float | None = 30.0
    ) -> CommandResult:
        """Run argv to completion; raise HostError if the host cannot be reached."""

    @abstractmethod
    def chunks(self, argv: Sequence[str]) -> AsyncIterator[bytes]:
        """Run argv and yield its stdout as raw byte chunks until it exits.

        Closing the iterator stops the process. Raises HostError when the host is lost.
        """

    async def lines(self, argv: Sequence[str]) -> AsyncIterator[str]:
        """Run argv and yield its stdout line by line (without the newline) until it exits.

        A last line without a newline is yielded when the process exits. Closing the
        iterator stops the process. Raises HostError when the host is lost.
        """
        pending = b""
        async with contextlib.aclosing(self.chunks(argv)) as chunks:
            async for chunk in chunks:
                *complete, pending = (pending + chunk).split(b"\n")
                for line in complete:
                    yield line.decode(errors="replace")
        if pending:
            yield pending.decode(errors="replace")

    async def home(self) -> str:
        """The home directory on the host (inside the prefix's container), for `~` paths."""
        result = await self.run(["sh", "-c", 'printf %s "$HOME"'])
        if not result.ok or not result.stdout:
            raise HostError(self.name, f"cannot read $HOME: {result.stderr.strip()}")
        return result.stdout

    async def expanded_runs_root(self) -> str:
        """Its runs root as a path on the host (`~` made its home), with no trailing slash."""
        root = self.runs_root
        if root == "~" or root.startswith("~/"):
            root = (await self.home()).rstrip("/") + root[1:]
        return root.rstrip("/")

    async def close(self) -> None:
        return None
