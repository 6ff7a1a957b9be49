"""A host reached over SSH (asyncssh): one connection per host, a channel per command,
reconnected with backoff after a drop, host keys checked."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import time
import warnings
from collections.abc import AsyncIterator, Sequence

# cryptography (51 and on) warns on import that DSA is deprecated, from asyncssh's own modules:
# three lines on the stderr of every command, burying what it prints (issue 44's "no
# stray lines"). Only that warning, raised in asyncssh's modules, is silenced.
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="DSA is deprecated", module="asyncssh")
    import asyncssh

from backends.hosts.base import (
    CHUNK_BYTES,
    DEFAULT_RUNS_ROOT,
    AuthFailed,
    CommandResult,
    Host,
    HostError,
    HostKeyRejected,
    HostUnreachable,
)
from backends.retry import Backoff

# Runs argv with stdin from /dev/null; SIGTERMs it when our stdin (the channel) closes.
# (A background job's stdin is /dev/null unless redirected, hence fd 3.) It goes before the
# host's prefix: `docker exec` without -i gives the container no stdin to watch.
_WATCHDOG = [
    "sh",
    "-c",
    'exec 3<&0; (cat <&3 >/dev/null 2>&1; kill -TERM $$ 2>/dev/null) & exec "$@" </dev/null 3<&-',
    "sh",
]


async def _read_all(process: asyncssh.SSHClientProcess) -> tuple[str, str]:
    """stdout and stderr to EOF, leaving stdin open (communicate() would close it)."""
    out, err = await asyncio.gather(process.stdout.read(), process.stderr.read())
    await process.wait()
    return out, err


# Channels that long-lived streams (GPU samples, followed files) leave to commands: a host
# following many runs must still answer the listings, kills and launches that say whether
# it is up. A stream beyond its share waits for one to close.
COMMAND_CHANNELS = 2
# SSH channels at once (commands and streams together), within sshd's MaxSessions (10).
MAX_CHANNELS = 8
# The first wait after a failed connect: short, as a dropped connection is usually remade
# at once (sshd restarted, a NAT entry expired).
CONNECT_RETRY_S = 0.25


class SSHHost(Host):
    """A host reached over SSH: one connection, opened on first use and shared by every
    command (at most `max_channels` at once, within sshd's MaxSessions, default 10; streams
    at most COMMAND_CHANNELS fewer).

    After a drop, the next call reconnects; while reconnecting keeps failing, calls fail
    fast with HostUnreachable until the next attempt is due (backends.retry.Backoff from
    CONNECT_RETRY_S up to `backoff_cap` seconds). Host keys are checked against
    `known_hosts` (default ~/.ssh/known_hosts; a missing file trusts nothing).
    ~/.ssh/config supplies what is not given here (user, port, identity files, ...).
    `jump` is another SSHHost whose connection carries this one.
    """

    def __init__(
        self,
        name: str,
        address: str,
        *,
        user: str | None = None,
        port: int | None = None,
        jump: SSHHost | None = None,
        known_hosts: str | None = None,
        client_keys: Sequence[str] | None = None,
        prefix: Sequence[str] = (),
        runs_root: str = DEFAULT_RUNS_ROOT,
        connect_timeout: float = 10.0,
        keepalive: float = 15.0,
        max_channels: int = MAX_CHANNELS,
        backoff_cap: float = 30.0,
    ):
        super().__init__(name, prefix=prefix, runs_root=runs_root)
        self.address = address
        self.user = user
        self.port = port
        self.jump = jump
        self.known_hosts = os.path.expanduser(known_hosts or "~/.ssh/known_hosts")
        self.client_keys = list(client_keys) if client_keys else None
        self.connect_timeout = connect_timeout
        self.keepalive = keepalive
        self.max_channels = max_channels
        self.connects = 0  # connections made so far: observable reuse and reconnects
        self._conn: asyncssh.SSHClientConnection | None = None
        self._connect_lock = asyncio.Lock()
        self._channels = asyncio.Semaphore(max_channels)
        self._streams = asyncio.Semaphore(max(1, max_channels - COMMAND_CHANNELS))
        self._backoff = Backoff(CONNECT_RETRY_S, backoff_cap)
        self._retry_at = 0.0
        self._last_error: HostError | None = None

    @property
    def target(self) -> str:
        user = f"{self.user}@" if self.user else ""
        port = f":{self.port}" if self.port else ""
        return f"{user}{self.address}{port}"

    async def connection(self) -> asyncssh.SSHClientConnection:
        """The live connection, made (or remade after a drop) if needed."""
        async with self._connect_lock:
            if self._conn is not None and not self._conn.is_closed():
                return self._conn
            self._conn = None
            wait = self._retry_at - time.monotonic()
            if wait > 0 and self._last_error is not None:
                raise type(self._last_error)(
                    self.name, f"{self._last_error.reason} (next attempt in {wait:.1f}s)"
                )
            try:
                self._conn = await self._connect()
            except HostError as e:
                self._retry_at = time.monotonic() + self._backoff.failed()
                self._last_error = e
                raise
            self._backoff.succeeded()
            self._last_error = None
            self.connects += 1
            return self._conn

    async def _connect(self) -> asyncssh.SSHClientConnection:
        tunnel = ()
        if self.jump is not None:
            try:
                tunnel = await self.jump.connection()
            except HostError as e:
                raise type(e)(self.name, f"via jump host {e}") from None
        # An empty trust store, not asyncssh's fallback to ~/.ssh/known_hosts or to no checks.
        if os.path.isfile(self.known_hosts):
            known_hosts = asyncssh.read_known_hosts(self.known_hosts)
        else:
            known_hosts = asyncssh.import_known_hosts("")
        try:
            return await asyncssh.connect(
                self.address,
                port=self.port or (),
                username=self.user or (),
                known_hosts=known_hosts,
                client_keys=self.client_keys or (),
                tunnel=tunnel,
                connect_timeout=self.connect_timeout,
                keepalive_interval=self.keepalive,
                keepalive_count_max=3,
            )
        except asyncssh.HostKeyNotVerifiable:
            raise HostKeyRejected(self.name, self._host_key_problem()) from None
        except asyncssh.PermissionDenied as e:
            raise AuthFailed(self.name, f"{self.target} refused our keys: {e.reason}") from None
        except asyncio.TimeoutError:
            raise HostUnreachable(
                self.name, f"cannot connect to {self.target}: no answer within {self.connect_timeout}s"
            ) from None
        except (OSError, asyncssh.Error) as e:
            reason = getattr(e, "reason", None) or str(e) or type(e).__name__
            raise HostUnreachable(self.name, f"cannot connect to {self.target}: {reason}") from None

    def _host_key_problem(self) -> str:
        port = self.port if self.port and self.port != 22 else None
        entry = f"[{self.address}]:{port}" if port else self.address
        recorded = False
        if os.path.isfile(self.known_hosts):
            recorded = bool(asyncssh.read_known_hosts(self.known_hosts).match(self.address, "", port)[0])
        if recorded:
            return (
                f"host key of {entry} does not match the one recorded in {self.known_hosts}; "
                "refusing to connect (the host was reinstalled, or someone is in the middle)"
            )
        return (
            f"host key of {entry} is not in {self.known_hosts}; refusing to connect. If the host "
            f"is genuine, record its key: ssh-keyscan {'-p ' + str(port) + ' ' if port else ''}"
            f"{self.address} >> {self.known_hosts}"
        )

    def _lost(self, conn: asyncssh.SSHClientConnection, error: BaseException) -> HostUnreachable:
        if self._conn is conn:
            self._conn = None
        conn.abort()
        reason = getattr(error, "reason", None) or str(error) or type(error).__name__
        return HostUnreachable(self.name, f"connection to {self.target} lost: {reason}")

    @contextlib.asynccontextmanager
    async def _process(
        self, argv: Sequence[str], input: str | None, *, stream: bool = False, **kwargs
    ) -> AsyncIterator[asyncssh.SSHClientProcess]:
        """A remote process on its own channel of the shared connection.

        sshd does not end a command when its channel closes, and cannot signal it for root
        logins; so unless stdin carries input, a watchdog holds stdin open and sends the
        command SIGTERM when it reaches EOF, i.e. when the channel closes early. (A command
        given input that times out is left to finish by itself.)
        """
        if self.on_reach is not None:
            await self.connection()  # one that cannot be made fails the command, in its own words
            await self.reached()
        if input is None:
            command = shlex.join(_WATCHDOG + self.full_argv(argv))
        else:
            command = self.shell_command(argv)
        async with self._streams if stream else contextlib.nullcontext(), self._channels:
            conn = await self.connection()
            try:
                process = await conn.create_process(command, stdin=asyncssh.PIPE, **kwargs)
            except asyncssh.ChannelOpenError as e:
                if conn.is_closed():
                    raise self._lost(conn, e) from None
                raise HostError(self.name, f"cannot open a channel: {e.reason}") from None
            except (OSError, asyncssh.Error) as e:
                raise self._lost(conn, e) from None
            try:
                yield process
            except (OSError, asyncssh.DisconnectError, asyncssh.ConnectionLost) as e:
                raise self._lost(conn, e) from None
            finally:
                process.close()

    async def run(self, argv, *, input=None, timeout=30.0):
        async with self._process(argv, input, encoding="utf-8", errors="replace") as process:
            try:
                async with asyncio.timeout(timeout):  # not wait_for: see LocalHost.run
                    out, err = await (_read_all(process) if input is None else process.communicate(input))
            except TimeoutError:
                raise HostError(self.name, f"command timed out after {timeout}s: {self.shell_command(argv)}") from None
            if process.returncode is None:
                raise asyncssh.ConnectionLost("the command ended without an exit status")
            return CommandResult(process.returncode, out, err)

    async def chunks(self, argv):
        async with self._process(argv, None, stream=True, encoding=None, stderr=asyncssh.DEVNULL) as process:
            while chunk := await process.stdout.read(CHUNK_BYTES):
                yield chunk
            await process.wait()
            if process.returncode is None:
                raise asyncssh.ConnectionLost("the command ended without an exit status")

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
            await conn.wait_closed()
