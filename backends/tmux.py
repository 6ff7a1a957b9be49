"""tmux over a Host: argv builders and the few async operations runs and kill need.

Every target is written `=NAME` (`exact`) so tmux matches the session name exactly (a
bare name would also match any session it is a prefix of). Every argv reaches tmux
through `tmux_argv`, which keeps each element one argument (tmux ends a command at an
argument ending in ';': a session `evil;` would have been `evil`), and tmux never expands
a target. Where tmux does expand formats (`-n`, `-s`, pipe-pane commands, `display -p`),
a value goes through `literal`. The user's default tmux server is used unless the host
asks for a dedicated socket (`host.tmux_socket`), so sessions trackside did not launch
are visible too.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from backends.hosts import Host, HostError

# The sessions trackside creates are named plainly, so that no shell, format or target
# syntax ever meets them. A session it did not create may have any name tmux allows.
SESSION_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,63}")

# A pane tmux marks as a trackside dashboard's (backends/own_session.py): what it draws
# is other runs' numbers, so no listing reads or records it.
DASHBOARD_OPTION = "@trackside-dashboard"
# A session tmux marks as the host's GPU recorder's (backends/recorder/start.py): no run,
# so no listing shows it.
RECORDER_OPTION = "@trackside-recorder"

# A pane record holds only what tmux itself wrote: ids, pids, numbers and flags (the
# dashboard mark as 1 or 0, never its value), so no process can print a line of one. A
# pane's command (argv[0], which tmux prints raw, newlines and all) is never read.
PANE_FIELDS = (
    "#{pane_id}",
    "#{session_id}",
    "#{pane_pid}",
    "#{pane_dead}",
    "#{pane_dead_status}",
    "#{pane_dead_signal}",
    "#{pane_pipe}",
    "#{session_created}",
    "#{window_index}",
    "#{pane_index}",
    "#{window_active}#{pane_active}",
    f"#{{?{DASHBOARD_OPTION},1,0}}",
    f"#{{?{RECORDER_OPTION},1,0}}",
)
_PANE_FORMAT = " ".join(PANE_FIELDS)
_RECORD = re.compile(r"(%\d+) (\$\d+) (\d+) ([01]) (-?\d*) (\d*) ([01]?) (\d*) (\d*) (\d*) ([01]{2}) ([01]) ([01])")
# Session names, which any process of the server's user may choose, follow the records,
# one `$id name` a line. tmux 3.x stores a name's control characters escaped, but one tmux
# printed over two lines (an older tmux keeps a newline) breaks the count of one line per
# session, and then each name is read by a query of its own.
_NAME_FORMAT = "#{session_id} #{session_name}"
_HASHES = re.compile("#+")


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
    pane_id: str = ""  # "%12": unique while the server lives
    piped: bool = False  # its output already goes to a pipe (ours, or one the user set)
    created: int = 0  # the session's creation time: with its name, one session ever
    window: int = 0
    index: int = 0
    active: bool = True  # the pane a user attaching to the session sees
    dashboard: bool = False  # a trackside dashboard runs or ran here (DASHBOARD_OPTION)
    session_id: str = ""  # "$3": unique while the server lives

    @property
    def target(self) -> str:
        return self.pane_id or f"{exact(self.session)}:"

    @property
    def where(self) -> str:
        """`window.pane`, as tmux numbers them for a user (`0.1`)."""
        return f"{self.window}.{self.index}"


def check_session_name(name: str) -> str:
    """`name` if trackside may name a session it creates so (`launch --session`)."""
    if not SESSION_NAME.fullmatch(name):
        raise ValueError(
            f"session name {name!r}: use letters, digits, '_' and '-' (up to 64, not starting with '-')"
        )
    return name


def is_session_name(name: str) -> bool:
    """Whether some tmux session could be named `name`, as tmux lists it: anything but
    empty or holding ':' or '.' (tmux stores those as '_'; in a target they would pick
    a window or a pane of another session)."""
    return bool(name) and not any(c in name for c in ":.\0")


def exact(session: str) -> str:
    """The target of the session named `session` and no other (`=`: a bare name is also
    a prefix or a pattern). ValueError for a name no session can have, and for one that
    starts with '$', which tmux takes for a session id even after '=' (`=$0` is session
    $0, whatever its name): that one is targeted by its id (`target`)."""
    if not is_session_name(session):
        raise ValueError(f"{session!r} cannot be a tmux session name")
    if session.startswith("$"):
        raise ValueError(f"tmux session {session!r} is targeted by its id: its name would be read as one")
    return f"={session}"


async def target(host: Host, session: str) -> str | None:
    """A target of the session named `session` and no other: `exact`'s, or the session's
    id where its name starts with '$'; None when the host has no such session."""
    if not session.startswith("$"):
        return exact(session)
    return next((pane.session_id for pane in await list_panes(host) if pane.session == session), None)


def literal(text: str, *, strftime: bool = False) -> str:
    """`text` as tmux must be given it where it expands formats, to use it unchanged: `#`
    starts a format there (`#(cmd)` runs a command), so each is doubled, but for a run of
    them before `[` (a style), which tmux passes on as it is. `strftime`: the position is
    one where tmux runs strftime too (pipe-pane commands, `display -p`), which needs `%`
    doubled; elsewhere (`-n`, `-s`) a doubled `%` would stay doubled."""
    text = _HASHES.sub(lambda m: m[0] if m.string.startswith("[", m.end()) else m[0] * 2, text)
    return text.replace("%", "%%") if strftime else text


def _socket(host: Host | None) -> str | None:
    return host.tmux_socket if host is not None else None


class _Then:
    """tmux's command separator, as trackside's own argv means it: a value `;` is text."""


THEN = _Then()


def _argument(text: str) -> str:
    # tmux takes an argument ending in ';' for the end of a command, and one ending in
    # '\;' for the same text ending in ';'.
    return f"{text[:-1]}\\;" if text.endswith(";") else text


# _argument for a shell that gives tmux its argv itself (the recorder's start, whose paths
# are known only on the host): `tmux_argument TEXT` sets $a to TEXT as tmux must be given it.
SHELL_ARGUMENT = r"""tmux_argument() { case $1 in *\;) a="${1%;}\\;" ;; *) a=$1 ;; esac; }"""


def tmux_argv(host: Host | None, *args: str | _Then) -> list[str]:
    """tmux with `args`, each one argument to it whatever it holds, the host's socket
    (None: the server $TMUX names, or the default one), commands split at THEN."""
    socket = _socket(host)
    return ["tmux", *(["-L", socket] if socket else []), *(";" if a is THEN else _argument(a) for a in args)]


def new_session_argv(host: Host, session: str, command: Sequence[str], pipe: str) -> list[str]:
    """One tmux invocation: create the session, keep the pane after exit, pipe its output.

    Chained with `;` so the options are in place before the server handles the pane's
    first output or its exit, however fast the command is. Prints the pane pid.
    """
    target = f"{exact(session)}:"
    return tmux_argv(
        host,
        "new-session", "-d", "-s", literal(session), "-x", "200", "-y", "50", "-P", "-F", "#{pane_pid}",
        "--", *command,
        THEN, "set-option", "-w", "-t", target, "remain-on-exit", "on",
        # tmux runs the pipe command (a shell command: backends.logs.recording.recorder) with sh -c.
        THEN, "pipe-pane", "-o", "-t", target, literal(pipe, strftime=True),
    )  # fmt: skip


async def new_session(host: Host, session: str, command: Sequence[str], pipe: str) -> int:
    """Start `command` (argv, executed without a shell) in a new detached session, its
    output piped to shell command `pipe`; its pane pid."""
    check_session_name(session)
    result = await host.run(new_session_argv(host, session, command, pipe))
    if not result.ok:
        raise TmuxError(host.name, f"tmux new-session {session}: {result.stderr.strip()}")
    try:
        return int(result.stdout.strip().splitlines()[0])
    except (ValueError, IndexError):
        raise TmuxError(host.name, f"tmux new-session {session} printed no pane pid: {result.stdout!r}")


def _parse_pane(match: re.Match, session: str) -> Pane:
    pane_id, session_id, pid, dead, status, signal, pipe, created, window, index, active, dashboard, _ = match.groups()
    exit_status = None
    if dead == "1":
        if signal.isdigit() and signal != "0":
            exit_status = -int(signal)
        elif status.lstrip("-").isdigit():
            exit_status = int(status)
    number = lambda text: int(text) if text.isdigit() else 0  # noqa: E731
    return Pane(
        session, int(pid), dead == "1", exit_status, pane_id, pipe == "1", number(created),
        number(window), number(index), active == "11", dashboard == "1", session_id,
    )  # fmt: skip


async def _session_names(host: Host, ids: list[str], lines: list[str]) -> dict[str, str]:
    """Each session id's name: from `lines` (`$id name` each) when they are one per
    session, else by one query per session (a session gone by then is left out)."""
    named = {line.partition(" ")[0]: line.partition(" ")[2] for line in lines}
    if len(lines) == len(ids) and set(named) == set(ids):
        return named
    names = {}
    for session_id in ids:
        result = await host.run(tmux_argv(host, "-u", "display-message", "-p", "-t", session_id, "#{session_name}"))
        if result.ok:
            names[session_id] = result.stdout.removesuffix("\n")
    return names


def _no_server(stderr: str) -> bool:
    # "no current target", "server exited unexpectedly": a server whose last session just
    # closed, about to exit or gone while it answered.
    return any(m in stderr for m in ("no server running", "error connecting to", "no current target", "server exited unexpectedly"))


async def list_panes(host: Host, session: str | None = None) -> list[Pane]:
    """Every pane on the host's tmux server (or of one session), but the GPU recorder's;
    [] when no server runs."""
    # One session's panes are found by its name here, never by a target tmux would parse.
    # -u: names as tmux holds them, whatever the host's locale (else 名前 prints as ____).
    if session is not None and not is_session_name(session):
        raise ValueError(f"{session!r} cannot be a tmux session name")
    argv = tmux_argv(host, "-u", "list-panes", "-a", "-F", _PANE_FORMAT, THEN, "list-sessions", "-F", _NAME_FORMAT)
    result = await host.run(argv)
    if not result.ok:
        if _no_server(result.stderr):
            return []
        raise TmuxError(host.name, f"tmux list-panes: {result.stderr.strip()}")
    # Split on "\n" alone (str.splitlines also splits on U+2028, \x1c, …): the records
    # first, each starting with its pane id, then the names, each with its session id.
    lines = result.stdout.split("\n")
    count = next((i for i, line in enumerate(lines) if not line.startswith("%")), len(lines))
    records = [(m, m.group(2)) for line in lines[:count] if (m := _RECORD.fullmatch(line))]
    ids = list(dict.fromkeys(session_id for _, session_id in records))
    names = await _session_names(host, ids, lines[count:-1])  # the output's last "\n" ends no name
    panes = [_parse_pane(m, names[session_id]) for m, session_id in records if session_id in names and m.group(13) == "0"]
    return panes if session is None else [pane for pane in panes if pane.session == session]


async def list_sessions(host: Host) -> list[str]:
    return list(dict.fromkeys(pane.session for pane in await list_panes(host)))


async def pane_pids(host: Host, session: str) -> list[int]:
    """Pids of the session's live panes."""
    return [pane.pid for pane in await list_panes(host, session) if not pane.dead]


async def capture_pane(host: Host, session: str, lines: int = 200) -> str:
    """What the session's pane shows, with up to `lines` lines of its scrollback above."""
    where = await target(host, session)
    if where is None:
        raise TmuxError(host.name, f"tmux capture-pane {session}: can't find session: {session}")
    result = await host.run(tmux_argv(host, "capture-pane", "-p", "-J", "-S", f"-{lines}", "-t", f"{where}:"))
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
    where = await target(host, session)
    if where is None:
        return False
    result = await host.run(tmux_argv(host, "kill-session", "-t", where))
    if result.ok:
        return True
    if _no_server(result.stderr) or "can't find" in result.stderr:
        return False
    raise TmuxError(host.name, f"tmux kill-session {session}: {result.stderr.strip()}")
