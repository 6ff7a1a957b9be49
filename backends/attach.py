"""Attach: open a run's tmux session in this terminal (the dashboard's `a`, suspended).

Locally that is `tmux attach`; on an SSH host it is OpenSSH with a terminal (`ssh -t`)
carrying the same target, port, jump host, key and known_hosts the host uses, and the
host's prefix (e.g. `pct exec 129 --`) before tmux, quoted once by Host.shell_command.
"""

from __future__ import annotations

import subprocess

from backends import tmux
from backends.hosts import Host, SSHHost


def ssh_options(host: SSHHost) -> list[str]:
    options = ["-o", f"UserKnownHostsFile={host.known_hosts}", "-o", "StrictHostKeyChecking=yes"]
    if host.port:
        options += ["-p", str(host.port)]
    for key in host.client_keys or []:
        options += ["-i", key]
    if host.jump is not None:
        options += ["-J", host.jump.target]
    return options


def attach_argv(host: Host, session: str) -> list[str]:
    argv = tmux.tmux_argv(host, "attach-session", "-t", f"={session}")
    if isinstance(host, SSHHost):
        destination = f"{host.user}@{host.address}" if host.user else host.address
        return ["ssh", "-t", *ssh_options(host), destination, host.shell_command(argv)]
    return host.full_argv(argv)


def attach(host: Host, session: str) -> int:
    """Run the attach in the foreground until the user detaches; its exit status.

    Blocking on purpose: the caller has handed this terminal over and waits for it back.
    """
    return subprocess.run(attach_argv(host, session)).returncode
