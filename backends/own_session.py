"""The tmux session this dashboard runs in: the one session trackside never stops.

Either of two signs is enough. tmux names the pane we run in ($TMUX_PANE), which means
something only on the server $TMUX names: pane ids repeat from server to server (each
`tmux -L` socket is one). And a pane's process tree holds this process or one it runs
under (a wrapper, a `trackside serve` parent), which still holds where $TMUX was dropped
on the way. Only on the local host: a remote host's pids and panes are never ours.
"""

from __future__ import annotations

import os
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
    result = await host.run(tmux.tmux_argv(host, "display-message", "-p", "-t", pane, "#{socket_path}:#{session_name}"))
    # A session name never holds ':', a socket path may.
    socket, _, session = result.stdout.strip().rpartition(":")
    return {session} if result.ok and socket == server and session else set()
