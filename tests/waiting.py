"""Waiting in tests: on the event itself where the kernel can tell it (a file made or
written in a directory: `Changes`), else a bounded poll at a sane interval; a failure
names what never happened. And `niced`, how a test starts a trainer."""

import asyncio
import ctypes
import json
import os
import select
import time

from training.contract import START

# A bound that only says "it hangs", for work whose length the machine's load decides: a
# trainer's start (its torch import took over 60 s at load 10-20, and 4 s when quiet). A
# test waits for the event that ends the slow part with this bound, then for what follows
# with a bound of its own.
HANG_S = 240.0

# Below the tests' own processes (a dashboard under Pilot waits on the CPU for every key),
# above a monkey's background run (nice 19, there only to be live): a trainer a test waits
# on still gets a share of a busy machine.
TRAINER_NICE = 10


def niced(argv: list[str]) -> list[str]:
    """A trainer's argv as a test runs it: at TRAINER_NICE (`nice` execs it: same pid)."""
    return ["nice", "-n", str(TRAINER_NICE), *argv]


async def wait_until(predicate, timeout: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)


def until(check, timeout: float, what: str, interval: float = 0.1):
    """check()'s first truthy value, polled every `interval` (no event to wake on: a
    screen in a tmux pane); an AssertionError naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"timed out after {timeout:g}s waiting for {what}"
        time.sleep(interval)
    return value


def trainer_started(run_dir) -> bool:
    """Whether a trainer's run dir holds its start event (the first line of its metrics):
    its imports done, however long the machine's load made them."""
    try:
        with open(os.path.join(run_dir, "metrics.jsonl")) as metrics:
            first = metrics.readline()
    except OSError:
        return False
    return first.endswith("\n") and json.loads(first).get("event") == START


_libc = ctypes.CDLL(None, use_errno=True)
# IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE | IN_DELETE (linux/inotify.h)
_MASK = 0x002 | 0x008 | 0x080 | 0x100 | 0x200


class Changes:
    """Linux inotify on one directory: `wait_until` wakes the moment a file in it is
    made, written, moved in or removed, so a test catches a window of milliseconds (a
    checkpoint mid-write) without polling at sub-millisecond intervals. Made before the
    thing awaited can happen, so that nothing is missed."""

    def __init__(self, directory) -> None:
        self.fd = _libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0 or _libc.inotify_add_watch(self.fd, os.fsencode(directory), _MASK) < 0:
            error = ctypes.get_errno()
            if self.fd >= 0:
                os.close(self.fd)
            raise OSError(error, f"inotify on {directory}: {os.strerror(error)}")

    def wait_until(self, predicate, timeout: float) -> bool:
        """Whether predicate() came true within timeout, checked at once and after each change."""
        deadline = time.monotonic() + timeout
        while not predicate():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if select.select([self.fd], [], [], left)[0]:
                try:
                    while os.read(self.fd, 65536):  # drained: the next select waits for a new change
                        pass
                except BlockingIOError:
                    pass
        return True

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> "Changes":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
