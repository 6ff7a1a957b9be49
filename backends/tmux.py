"""tmux over a Host: argv builders and the few async operations runs and kill need.

Every target is written `=NAME` so tmux matches the session name exactly (a bare name
would also match any session it is a prefix of). The user's default tmux server is used
unless the host asks for a dedicated socket (`host.tmux_socket`), so sessions trackside
did not launch are visible too.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from backends.hosts import Host, HostError

# tmux reads ':' and '.' in a target as window/pane separators; keep names plain.
SESSION_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,63}")

# ':' separates the fields: tmux never allows it in a session name, and prints control
# characters such as tab as '_' unless the client's locale is UTF-8 (ssh often is not).
_PANE_FIELDS = (
    "#{pane_pid}",
    "#{pane_dead}",
    "#{pane_dead_status}",
    "#{pane_dead_signal}",
    "#{pane_id}",
    "#{pane_pipe}",
    "#{session_created}",
    "#{window_index}",
    "#{pane_index}",
    "#{window_active}#{pane_active}",
    "#{pane_current_command}",
    "#{session_name}",
)
_PANE_FORMAT = ":".join(_PANE_FIELDS)


HISTORY_LINES = 2000  # tmux's default history-limit: all the scrollback a pane usually has

# For each target "$3"... (`=session:`, or a pane id): a record-separator line naming it,
# then its pane's last "$1" lines; "$2" is the host's tmux socket, or empty for the
# default server. Pane text holds no control characters (tmux keeps only what a terminal
# would show).
_CAPTURE_PANES = r"""
lines=$1; socket=$2; shift 2
for t in "$@"; do
  text=$(tmux ${socket:+-L "$socket"} capture-pane -p -J -S "-$lines" -t "$t" 2>/dev/null) || continue
  printf '\036%s\n%s\n' "$t" "$text"
done
"""


class TmuxError(HostError):
    """tmux refused a command; the message carries tmux's own words."""


@dataclass(frozen=True)
class Pane:
    session: str
    pid: int
    dead: bool
    # Exit status of a dead pane: the code, or minus the signal that ended it. tmux 3.3
    # sometimes never fills it in (a dead pane with no status), so runs record their own.
    exit_status: int | None
    command: str
    pane_id: str = ""  # "%12": unique while the server lives
    piped: bool = False  # its output already goes to a pipe (ours, or one the user set)
    created: int = 0  # the session's creation time: with its name, one session ever
    window: int = 0
    index: int = 0
    active: bool = True  # the pane a user attaching to the session sees

    @property
    def target(self) -> str:
        return self.pane_id or f"={self.session}:"

    @property
    def where(self) -> str:
        """`window.pane`, as tmux numbers them for a user (`0.1`)."""
        return f"{self.window}.{self.index}"


def check_session_name(name: str) -> str:
    if not SESSION_NAME.fullmatch(name):
        raise ValueError(
            f"session name {name!r}: use letters, digits, '_' and '-' (up to 64, not starting with '-')"
        )
    return name


def _socket(host: Host) -> str | None:
    return getattr(host, "tmux_socket", None)


def tmux_argv(host: Host, *args: str) -> list[str]:
    socket = _socket(host)
    return ["tmux", *(["-L", socket] if socket else []), *args]


def pipe_command(command: str) -> str:
    """A shell command as `pipe-pane` must be given it: tmux expands `#…` formats in it
    (`#(cmd)` runs a command) and strftime's `%…` before its shell sees it."""
    return command.replace("#", "##").replace("%", "%%")


def new_session_argv(host: Host, session: str, command: Sequence[str], console_log: str) -> list[str]:
    """One tmux invocation: create the session, keep the pane after exit, pipe its output.

    Chained with `;` so the options are in place before the server handles the pane's
    first output or its exit, however fast the command is. Prints the pane pid.
    """
    target = f"={session}:"
    return tmux_argv(
        host,
        "new-session", "-d", "-s", session, "-x", "200", "-y", "50", "-P", "-F", "#{pane_pid}",
        "--", *command,
        ";", "set-option", "-w", "-t", target, "remain-on-exit", "on",
        # tmux runs the pipe command with sh -c: the path is quoted here, once.
        ";", "pipe-pane", "-o", "-t", target, pipe_command(f"cat >> {shlex.quote(console_log)}"),
    )  # fmt: skip


async def new_session(host: Host, session: str, command: Sequence[str], console_log: str) -> int:
    """Start `command` (argv, executed without a shell) in a new detached session; its pane pid."""
    check_session_name(session)
    result = await host.run(new_session_argv(host, session, command, console_log))
    if not result.ok:
        raise TmuxError(host.name, f"tmux new-session {session}: {result.stderr.strip()}")
    try:
        return int(result.stdout.strip().splitlines()[0])
    except (ValueError, IndexError):
        raise TmuxError(host.name, f"tmux new-session {session} printed no pane pid: {result.stdout!r}")


def _parse_pane(line: str) -> Pane | None:
    # Fixed fields, the command (may hold ':'), then the session (never does).
    fixed = len(_PANE_FIELDS) - 2
    fields = line.split(":", fixed)
    if len(fields) != fixed + 1 or not fields[0].isdigit() or ":" not in fields[-1]:
        return None
    pid, dead, status, signal, pane_id, pipe, created, window, index, active, rest = fields
    command, _, session = rest.rpartition(":")
    exit_status = None
    if dead == "1":
        if signal.isdigit() and signal != "0":
            exit_status = -int(signal)
        elif status.lstrip("-").isdigit():
            exit_status = int(status)
    number = lambda text: int(text) if text.isdigit() else 0  # noqa: E731
    return Pane(
        session, int(pid), dead == "1", exit_status, command, pane_id, pipe == "1", number(created),
        number(window), number(index), active == "11",
    )  # fmt: skip


def _no_server(stderr: str) -> bool:
    # "no current target", "server exited unexpectedly": a server whose last session just
    # closed, about to exit or gone while it answered.
    return any(m in stderr for m in ("no server running", "error connecting to", "no current target", "server exited unexpectedly"))


async def list_panes(host: Host, session: str | None = None) -> list[Pane]:
    """Every pane on the host's tmux server (or of one session); [] when no server runs."""
    scope = ["-s", "-t", f"={session}"] if session is not None else ["-a"]
    result = await host.run(tmux_argv(host, "list-panes", *scope, "-F", _PANE_FORMAT))
    if not result.ok:
        if _no_server(result.stderr) or (session is not None and "can't find" in result.stderr):
            return []
        raise TmuxError(host.name, f"tmux list-panes: {result.stderr.strip()}")
    return [pane for line in result.stdout.splitlines() if (pane := _parse_pane(line))]


async def list_sessions(host: Host) -> list[str]:
    return list(dict.fromkeys(pane.session for pane in await list_panes(host)))


async def pane_pids(host: Host, session: str) -> list[int]:
    """Pids of the session's live panes."""
    return [pane.pid for pane in await list_panes(host, session) if not pane.dead]


async def capture_pane(host: Host, session: str, lines: int = 200) -> str:
    """What the session's pane shows, with up to `lines` lines of its scrollback above."""
    result = await host.run(tmux_argv(host, "capture-pane", "-p", "-J", "-S", f"-{lines}", "-t", f"={session}:"))
    if not result.ok:
        raise TmuxError(host.name, f"tmux capture-pane {session}: {result.stderr.strip()}")
    return result.stdout


async def capture_panes(host: Host, targets: Sequence[str], lines: int = HISTORY_LINES) -> dict[str, str]:
    """What each target (`=session:` for a session's active pane, or a pane id) shows, with
    its scrollback, in one host command; a target that is gone by then is left out."""
    if not targets:
        return {}
    result = await host.run(["sh", "-c", _CAPTURE_PANES, "sh", str(lines), _socket(host) or "", *targets])
    captured = {}
    for record in result.stdout.split("\036")[1:]:
        target, _, text = record.partition("\n")
        if target in targets:
            captured[target] = text
    return captured


async def kill_session(host: Host, session: str) -> bool:
    """Kill the session; False if it was already gone."""
    result = await host.run(tmux_argv(host, "kill-session", "-t", f"={session}"))
    if result.ok:
        return True
    if _no_server(result.stderr) or "can't find" in result.stderr:
        return False
    raise TmuxError(host.name, f"tmux kill-session {session}: {result.stderr.strip()}")
