"""A host's processes, read with one `ps`, and the process trees of tmux panes.

A pane's tree is every process in the session of the pane's process (tmux makes it a
session leader), in its process group, and every descendant of those (which catches
workers that left the session with setsid). A process is named by its pid and its start
time together: a pid alone may be reused by an unrelated process at any moment.
"""

from __future__ import annotations

from dataclasses import dataclass

from backends import tmux
from backends.hosts import Host, HostError

# pid ppid pgid sid stat lstart comm (lstart is 5 words, fixed for a process's life)
_PS = ["ps", "-eo", "pid=,ppid=,pgid=,sid=,stat=,lstart=,comm="]
# Interactive shells, by their process name (a login shell's is `-bash`).
_SHELLS = frozenset({"sh", "bash", "zsh", "fish", "dash", "ksh", "mksh", "tcsh", "csh", "ash", "busybox"})


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    pgid: int
    sid: int
    zombie: bool
    started: str  # lstart's words joined by single spaces
    command: str = ""  # its process name (comm)


async def process_table(host: Host) -> dict[int, Proc]:
    result = await host.run(_PS)
    if not result.ok:
        raise HostError(host.name, f"ps failed: {result.stderr.strip()}")
    table = {}
    for line in result.stdout.splitlines():
        fields = line.split(None, 10)
        if len(fields) >= 10 and all(f.isdigit() for f in fields[:4]):
            pid, ppid, pgid, sid = map(int, fields[:4])
            command = fields[10] if len(fields) == 11 else ""
            table[pid] = Proc(pid, ppid, pgid, sid, fields[4].startswith("Z"), " ".join(fields[5:10]), command)
    return table


def descendants(table: dict[int, Proc], pids: set[int]) -> set[int]:
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


def process_tree(table: dict[int, Proc], panes: list[tmux.Pane]) -> set[int]:
    """Live pids of the panes' sessions and process groups, and all their descendants."""
    roots = set()
    for pane in panes:
        if pane.dead and pane.pid in table:
            continue  # the pane's process is gone and its pid belongs to someone else now
        roots.add(pane.pid)
    return descendants(table, {p.pid for p in table.values() if p.pid in roots or p.sid in roots or p.pgid in roots})


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
    return descendants(table, {p.pid for p in table.values() if p.pgid in groups}) - {root.pid}
