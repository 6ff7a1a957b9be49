"""The tmux session this dashboard runs in: the one session trackside never stops.

Either of two signs is enough. tmux names the pane we run in ($TMUX_PANE), which means
something only on the server $TMUX names: pane ids repeat from server to server (each
`tmux -L` socket is one). And a pane's process tree holds this process or one it runs
under (a wrapper, a `trackside serve` parent), which still holds where $TMUX was dropped
on the way. Only on the local host: a remote host's pids and panes are never ours.

A dashboard also marks its pane for every other listing, on any host (`mark_own_pane`).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping

from backends import procs, tmux
from backends.hosts import Host, HostError


async def own_sessions(
    host: Host, panes: list[tmux.Pane], *, pid: int | None = None, env: Mapping[str, str] | None = None
) -> set[str]:
    """The sessions whose stopping would stop process `pid` (this process by default):
    any of `panes`' sessions holding it in its tree, and the session of $TMUX_PANE in `env`
    (os.environ by default)."""
    if not host.is_local or not panes:
        return set()
    found = await _session_of_tmux_pane(host, os.environ if env is None else env)
    try:
        table = await procs.process_table(host)
    except HostError:
        # A ps without these columns (BSD's has no sid) must not stop the runs being
        # listed; a kill needs the table too, so there it fails in ps's own words.
        return found
    ours = procs.ancestry(table, os.getpid() if pid is None else pid)
    by_session: dict[str, list[tmux.Pane]] = {}
    for pane in panes:
        by_session.setdefault(pane.session, []).append(pane)
    return found | {session for session, its in by_session.items() if procs.process_tree(table, its) & ours}


async def _session_of_tmux_pane(host: Host, env: Mapping[str, str]) -> set[str]:
    server = env.get("TMUX", "").split(",")[0]  # "socket path,server pid,session index"
    pane = env.get("TMUX_PANE", "")
    if not server or not pane:
        return set()
    result = await host.run(tmux.tmux_argv(host, "-u", "display-message", "-p", "-t", pane, "#{socket_path}:#{session_name}"))
    # A session name never holds ':', a socket path may.
    socket, _, session = result.stdout.strip().rpartition(":")
    return {session} if result.ok and socket == server and session else set()


def mark_own_pane(env: Mapping[str, str] = os.environ) -> None:
    """Mark the tmux pane this dashboard runs in ($TMUX_PANE, on $TMUX's server) as a
    dashboard's for the pane's life: what it draws, and what its scrollback holds after
    it quits, is other runs' numbers, which no listing may take for a run of its own
    (tmux.DASHBOARD_OPTION). Outside tmux, or on a tmux without pane options, nothing."""
    server, pane = env.get("TMUX", "").split(",")[0], env.get("TMUX_PANE", "")
    if server and pane:
        argv = ["tmux", "-S", server, "set-option", "-p", "-t", pane, tmux.DASHBOARD_OPTION, "1"]
        try:
            subprocess.run(argv, capture_output=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            pass  # its own listing still knows it (own_sessions); others read it as before
