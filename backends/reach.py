"""Every configured host at once: a read of each (one that cannot be reached is named,
not fatal while another answers), and the host that holds a run or a tmux session."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TypeVar

from backends import runs, tmux
from backends.hosts import Host, HostError
from training.contract import UsageError

T = TypeVar("T")


async def everywhere(names: Sequence[str], hosts: Mapping[str, Host], read: Callable[[Host], Awaitable[T]]) -> tuple[dict[str, T], list[str]]:
    """`read(host)` on every named host at once: what each gave, and a line for each that
    could not be reached; HostError only when none could."""
    got = await asyncio.gather(*(read(hosts[name]) for name in names), return_exceptions=True)
    results = {name: value for name, value in zip(names, got) if not isinstance(value, BaseException)}
    failures = [value for value in got if isinstance(value, BaseException)]
    for error in failures:
        if not isinstance(error, HostError):
            raise error
    if failures and not results:
        raise failures[0] if len(failures) == 1 else HostError(", ".join(names), "no host could be read: " + "; ".join(map(str, failures)))
    return results, [str(error) for error in failures]


async def holder(target: str, names: Sequence[str], hosts: Mapping[str, Host]) -> str:
    """The host that holds `target` (a run id, or a tmux session name): one host's name,
    else RunError saying where it was looked for, or UsageError when a session of that
    name is on several hosts."""

    async def holds(host: Host) -> bool:
        if runs.RUN_ID.fullmatch(target):
            try:
                await runs.read_manifest(host, target)
                return True
            except runs.RunError:
                return False
        return bool(await tmux.list_panes(host, target))

    found, unreachable = await everywhere(names, hosts, holds)
    holding = [name for name in names if found.get(name)]
    if len(holding) > 1 and not runs.RUN_ID.fullmatch(target):  # a multi-node run's dir is on each of its hosts
        raise UsageError(f"tmux session {target!r} is on {', '.join(holding)}: say which with --host")
    if not holding:
        lost = f" ({'; '.join(unreachable)})" if unreachable else ""
        what = f"run {target}" if runs.RUN_ID.fullmatch(target) else f"run or tmux session {target!r}"
        raise runs.RunError(f"no {what} on {', '.join(found)}{lost}")
    return holding[0]
