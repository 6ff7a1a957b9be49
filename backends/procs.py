"""A host's processes, read from its /proc in one command, and the process trees of tmux
panes.

A process is named by its pid and its start time together (`Proc.started`: clock ticks
after boot, /proc/PID/stat's field 22): a pid alone may be reused by an unrelated process
at any moment, and within the same second too.

A pane's tree is what descends from the pane's process: its children and theirs, and
every process in a session or process group that a process of the tree leads (tmux makes
the pane's process a session leader; a process orphaned to init keeps its session, and
workers that left the session with setsid still descend). While its leader lives, a
session or group is the leader's: its id is the leader's pid, which the kernel does not
give out again while the leader, or anything in its session or group, lives.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from backends import tmux
from backends.hosts import Host, HostError

# Every /proc/PID/stat, each line prefixed by its file's name: a process name (comm) may
# hold a newline, ')' and spaces, but the line grep starts after that newline is prefixed
# with the same real file name, so no name can forge another process's record. C locale
# and -a: a name's bytes are never "binary".
_READ_STAT = "LC_ALL=C exec grep -aHs '' /proc/[0-9]*/stat"
_PREFIX = re.compile(r"/proc/(\d+)/stat:")
# Interactive shells, by their process name (a login shell's is `-bash`).
_SHELLS = frozenset({"sh", "bash", "zsh", "fish", "dash", "ksh", "mksh", "tcsh", "csh", "ash", "busybox"})
# Each pane of a session as tmux knows it: fields only tmux writes, digits all.
_PANE_PIDS = "#{pane_pid} #{pane_dead}"
_PANE_PID_LINE = re.compile(r"(\d+) ([01])")


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    pgid: int
    sid: int
    zombie: bool
    started: int  # clock ticks after boot: with the pid, the process's identity
    command: str = ""  # its process name (comm)
    # Its terminal's foreground process group (-1: none), and whether it is stopped (^Z):
    # where a pane's shell is (at_prompt), no part of who the process is.
    tpgid: int = field(default=-1, compare=False)
    stopped: bool = field(default=False, compare=False)


def parse_stat(pid: int, text: str) -> Proc | None:
    """A process from its /proc/PID/stat text; None for text that is none. The name sits
    between the first '(' and the last ')': it may hold both, and spaces."""
    head, close, tail = text.rpartition(")")
    start, opened, command = head.partition(" (")
    fields = tail.split()
    if not close or not opened or start != str(pid) or len(fields) < 20:
        return None
    state, numbers = fields[0], fields[1:4] + fields[19:20]
    if not all(n.isdigit() for n in numbers):
        return None
    ppid, pgid, sid, started = map(int, numbers)
    tpgid = int(fields[5]) if fields[5].removeprefix("-").isdigit() else -1
    return Proc(pid, ppid, pgid, sid, state in ("Z", "X"), started, command, tpgid, state in ("T", "t"))


async def process_table(host: Host) -> dict[int, Proc]:
    result = await host.run(["sh", "-c", _READ_STAT])
    if not result.stdout:  # grep exits 2 when a process ended between the glob and its read
        raise HostError(host.name, f"cannot read /proc: {result.stderr.strip() or f'exit status {result.returncode}'}")
    texts: dict[int, list[str]] = {}
    for line in result.stdout.split("\n"):
        if m := _PREFIX.match(line):
            texts.setdefault(int(m[1]), []).append(line[m.end():])
    return {pid: proc for pid, lines in texts.items() if (proc := parse_stat(pid, "\n".join(lines)))}


def same(table: Mapping[int, Proc], known: Mapping[int, int]) -> dict[int, int]:
    """The known processes (pid: start time) still alive as themselves."""
    return {pid: t for pid, t in known.items() if pid in table and not table[pid].zombie and table[pid].started == t}


def descendants(table: dict[int, Proc], pids: Collection[int]) -> set[int]:
    """pids and every live descendant of them."""
    children: dict[int, list[int]] = {}
    for p in table.values():
        children.setdefault(p.ppid, []).append(p.pid)
    members, stack = set(pids), list(pids)
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in members:
                members.add(child)
                stack.append(child)
    return {pid for pid in members if pid in table and not table[pid].zombie}


def ancestry(table: dict[int, Proc], pid: int) -> set[int]:
    """pid and every process it runs under, up to the first one the table lacks."""
    chain: set[int] = set()
    while pid in table and pid not in chain:
        chain.add(pid)
        pid = table[pid].ppid
    return chain


def tree_of(table: dict[int, Proc], roots: Collection[int], leaders: Collection[int] = ()) -> set[int]:
    """The live processes that descend from `roots` (pids alive in `table`): their
    descendants, and the members of every session and process group one of those leads,
    and theirs, until nothing is added. `leaders`: ids of sessions and groups to follow
    though their leader has ended (the caller proved them the tree's). Pid 1 is never a
    root nor in the tree."""
    members = descendants(table, {pid for pid in roots if pid > 1 and pid in table})
    while True:
        led = members | set(leaders)
        grown = descendants(table, members | {p.pid for p in table.values() if p.sid in led or p.pgid in led}) - {0, 1}
        if grown == members:
            return members
        members = grown


def process_tree(table: dict[int, Proc], panes: list[tmux.Pane]) -> set[int]:
    """Live pids of what descends from the panes' processes (tree_of)."""
    # A dead pane's pid, if it is in the table, belongs to someone else now.
    return tree_of(table, {pane.pid for pane in panes if not pane.dead})


async def pane_roots(host: Host, session: str) -> set[int]:
    """The pids tmux names as the live panes of `session`, read in a form no process can
    forge (digits only, one line a pane): only these may root a tree to be signalled."""
    where = await tmux.target(host, session)  # a name starting with '$' is found by its id
    result = await host.run(tmux.tmux_argv(host, "-u", "list-panes", "-s", "-t", where, "-F", _PANE_PIDS)) if where else None
    if result is None or not result.ok:
        return set()
    lines = [_PANE_PID_LINE.fullmatch(line) for line in result.stdout.splitlines()]
    return {int(m[1]) for m in lines if m and m[2] == "0" and int(m[1]) > 1}


def at_prompt(table: dict[int, Proc], pane: tmux.Pane) -> bool:
    """Whether a live pane's process is a shell whose foreground program has returned to
    it: the shell holds its terminal again (the terminal's foreground group is the
    shell's), and no child runs in the shell's own group (a shell without job control,
    `sh -c prog`, runs its program there). A job left in the background (`tensorboard &`)
    is not the program; a job stopped with ^Z still is. A pane whose process is the
    program itself dies with it instead."""
    root = table.get(pane.pid)
    if root is None or pane.dead or root.zombie or root.command.lstrip("-") not in _SHELLS or root.tpgid != root.pgid:
        return False
    children = [p for p in table.values() if p.ppid == root.pid and not p.zombie]
    return not any(p.pgid == root.pgid or p.stopped for p in children)


def shell_jobs(table: dict[int, Proc], pane: tmux.Pane) -> set[int] | None:
    """What a pane's interactive shell runs, if it runs anything as a job: every process of
    its children's own process groups (job control gives each job a group of its own in
    the shell's session), and their descendants; the shell itself is not among them. None
    when the pane's process is no such shell: trackside's `sh -c` wrapper keeps its child
    in its own group, and a program's workers that left with setsid are in a session of
    their own."""
    root = table.get(pane.pid)
    if root is None or pane.dead or root.command.lstrip("-") not in _SHELLS:
        return None
    groups = {p.pgid for p in table.values() if p.ppid == root.pid and p.pgid != root.pgid and p.sid == root.sid}
    if not groups:
        return None
    return tree_of(table, {p.pid for p in table.values() if p.pgid in groups}) - {root.pid}
