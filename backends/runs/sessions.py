"""A run's tmux session name: the one trackside makes, the one its user gave, and which of
them a relaunch takes."""

from __future__ import annotations

from backends import tmux
from backends.hosts import Host


def session_name(run_id: str) -> str:
    """The tmux session a run is launched in unless it is given one."""
    return f"ts-{run_id}"


def named_by_user(manifest: dict) -> str | None:
    """The session name the user gave the run (`launch --session`), which its relaunches
    keep; None for the name trackside made (`session_name`), or one it could not make."""
    name = manifest.get("session")
    if not isinstance(name, str) or name == session_name(manifest["run_id"]):
        return None
    try:
        return tmux.check_session_name(name)
    except ValueError:
        return None


async def parent_session_name(host: Host, parent: dict) -> tuple[str | None, str]:
    """The session a relaunch of `parent` (its manifest on `host`) is launched in there,
    and why not its parent's (words, or ""). A user's name passes on once its session is gone, as it is after a kill (which
    closes it before R relaunches) or holds only the parent's ended pane, closed now: its
    output is in its console.log. A session that still runs anything keeps the name."""
    name = named_by_user(parent)
    if name is None:
        return None, ""
    panes = await tmux.list_panes(host, name)
    if any(p.pid != parent.get("pane_pid") for p in panes):
        return None, f"tmux session {name} holds panes other than its parent's"
    if any(not p.dead for p in panes):
        return None, f"its parent still runs in tmux session {name}"
    if panes:
        await tmux.kill_session(host, name)
    return name, ""
