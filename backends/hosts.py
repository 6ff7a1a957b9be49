"""Hosts: where commands run. Every command is an argv list; quoting happens once, here.

`LocalHost` runs argv with asyncio subprocesses. `SSHHost` (asyncssh) keeps one connection
per host and opens a channel per command. Both apply the host's command prefix (for
containers: `pct exec 129 --`, `docker exec NAME`) to every argv.
"""

from __future__ import annotations

import asyncio
import shlex
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

DEFAULT_RUNS_ROOT = "~/.trackside/runs"


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
    """A machine that runs argv lists. Subclasses implement `run` and `lines`."""

    def __init__(self, name: str, *, prefix: Sequence[str] = (), runs_root: str = DEFAULT_RUNS_ROOT):
        self.name = name
        self.prefix = list(prefix)
        self.runs_root = runs_root

    @property
    def is_local(self) -> bool:
        return False

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
    def lines(self, argv: Sequence[str]) -> AsyncIterator[str]:
        """Run argv and yield its stdout line by line (without the newline) until it exits.

        Closing the iterator stops the process. Raises HostError when the host is lost.
        """

    async def home(self) -> str:
        """The home directory on the host (inside the prefix's container), for `~` paths."""
        result = await self.run(["sh", "-c", 'printf %s "$HOME"'])
        if not result.ok or not result.stdout:
            raise HostError(self.name, f"cannot read $HOME: {result.stderr.strip()}")
        return result.stdout

    async def close(self) -> None:
        return None


class LocalHost(Host):
    def __init__(self, name: str = "local", *, prefix: Sequence[str] = (), runs_root: str = DEFAULT_RUNS_ROOT):
        super().__init__(name, prefix=prefix, runs_root=runs_root)

    @property
    def is_local(self) -> bool:
        return not self.prefix

    async def run(self, argv, *, input=None, timeout=30.0):
        full = self.full_argv(argv)
        try:
            proc = await asyncio.create_subprocess_exec(
                *full,
                stdin=asyncio.subprocess.PIPE if input is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
            )
        except FileNotFoundError:
            return CommandResult(127, "", f"{full[0]}: command not found")
        try:
            out, err = await asyncio.wait_for(
                proc.communicate(input.encode() if input is not None else None), timeout
            )
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
            raise HostError(self.name, f"command timed out after {timeout}s: {shlex.join(full)}")
        return CommandResult(proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"))

    async def lines(self, argv):
        full = self.full_argv(argv)
        try:
            proc = await asyncio.create_subprocess_exec(
                *full,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL,
                start_new_session=True,
                limit=1 << 20,
            )
        except FileNotFoundError:
            raise HostError(self.name, f"{full[0]}: command not found")
        try:
            assert proc.stdout is not None
            while line := await proc.stdout.readline():
                yield line.decode(errors="replace").rstrip("\n")
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
