"""Hosts: where commands run. Every command is an argv list; quoting happens once, in
`Host.shell_command` (base.py).

`LocalHost` (local.py) runs argv with asyncio subprocesses. `SSHHost` (ssh.py, asyncssh)
keeps one connection per host and opens a channel per command. Both apply the host's
command prefix (for containers: `pct exec 129 --`, `docker exec NAME`) to every argv.
Callers import from here.
"""

from backends.hosts.base import (
    DEFAULT_RUNS_ROOT,
    AuthFailed,
    CommandResult,
    Host,
    HostError,
    HostKeyRejected,
    HostUnreachable,
    check_argv,
)
from backends.hosts.local import LocalHost
from backends.hosts.ssh import MAX_CHANNELS, SSHHost

__all__ = [
    "DEFAULT_RUNS_ROOT",
    "MAX_CHANNELS",
    "AuthFailed",
    "CommandResult",
    "Host",
    "HostError",
    "HostKeyRejected",
    "HostUnreachable",
    "LocalHost",
    "SSHHost",
    "check_argv",
]
