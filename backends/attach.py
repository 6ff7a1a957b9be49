"""Attach: open a run's tmux session from the dashboard (its `a`).

Outside tmux the dashboard hands its terminal over: locally `tmux attach`; on an SSH host
OpenSSH with a terminal (`ssh -t`) carrying the same target, port, jump host, key and
known_hosts the host uses, and the host's prefix (e.g. `pct exec 129 --`) before tmux,
quoted once by Host.shell_command.

Inside tmux (the usual way over SSH) `tmux attach` refuses to nest. A session on the
dashboard's own tmux server is switched to (this client shows it; tmux's last-session key
comes back); any other session opens in a new window of the dashboard's tmux, running
the attach with TMUX unset, named for the session: its name (anyone's choice, `#(…)`
included) reaches tmux's `-n` only through tmux.literal, and the targets as one argv
element each, which tmux never expands.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Mapping

from backends import tmux
from backends.hosts import Host, LocalHost, SSHHost


class AttachError(Exception):
    """tmux could not show the session; the message says why and what to run instead."""


def ssh_options(host: SSHHost) -> list[str]:
    options = ["-o", f"UserKnownHostsFile={host.known_hosts}", "-o", "StrictHostKeyChecking=yes"]
    if host.port:
        options += ["-p", str(host.port)]
    for key in host.client_keys or []:
        options += ["-i", key]
    if host.jump is not None:
        options += ["-J", host.jump.target]
    return options


def attach_argv(host: Host, session: str, target: str | None = None) -> list[str]:
    """The attach to `session`, by `target` where given (tmux.target's: the id of a
    session whose name starts with '$'), else by its exact name."""
    argv = tmux.tmux_argv(host, "attach-session", "-t", target or tmux.exact(session))
    if isinstance(host, SSHHost):
        destination = f"{host.user}@{host.address}" if host.user else host.address
        return ["ssh", "-t", *ssh_options(host), destination, host.shell_command(argv)]
    return host.full_argv(argv)


def attach(host: Host, session: str, target: str | None = None) -> int:
    """Run the attach in the foreground until the user detaches; its exit status.

    Blocking on purpose: the caller has handed this terminal over and waits for it back.
    """
    return subprocess.run(attach_argv(host, session, target)).returncode


def inside_tmux(env: Mapping[str, str] = os.environ) -> bool:
    return bool(env.get("TMUX"))


async def _same_server(host: Host, env: Mapping[str, str]) -> bool:
    """Whether the host's tmux server is the one this dashboard runs in."""
    if not host.is_local:
        return False
    ours = env.get("TMUX", "").split(",")[0]
    result = await host.run(tmux.tmux_argv(host, "list-sessions", "-F", "#{socket_path}"))
    return result.ok and ours in result.stdout.split("\n")


async def attach_inside_tmux(host: Host, session: str, env: Mapping[str, str] = os.environ) -> str:
    """Show the session from inside the dashboard's tmux; what was done, in words.

    Raises AttachError with tmux's own words and the command to run by hand."""
    here = LocalHost()  # the dashboard's machine, whose tmux client is the user's
    where = await tmux.target(host, session)
    if where is None:
        raise AttachError(f"cannot open {session}: the host has no such tmux session now")
    if await _same_server(host, env):
        result = await here.run(tmux.tmux_argv(None, "switch-client", "-t", where))
        if result.ok:
            return f"switched this tmux client to {session}; tmux's last-session key (prefix L) comes back"
        how = shlex.join(["tmux", "switch-client", "-t", where])
    else:
        argv = attach_argv(host, session, where)
        # Parsed by this tmux, then the attach by the host's: each gets its own quoting.
        result = await here.run(tmux.tmux_argv(None, "new-window", "-n", tmux.literal(session), "--", "env", "-u", "TMUX", *argv))
        if result.ok:
            return f"opened {session} in a new tmux window"
        how = shlex.join(argv)
    raise AttachError(f"cannot open {session} from inside tmux ({result.stderr.strip() or result.returncode}); run: {how}")
