"""A relaunch's process starts while the run it replaces is still stopping: its imports
overlap the stop's seconds, and here, before anything touches the device (torchrun's
process group included), it waits for that run's processes to end (`--after-pids`). The
GPU's memory is given back as a process exits, so the device is free once they are gone."""
from __future__ import annotations

import os
import time

WAIT_S = 600.0  # past any kill's grace and SIGKILL: a run still there is not being stopped


class StillRunning(RuntimeError):
    pass


def alive(pid: int) -> bool:
    """Whether `pid` runs still; an exited process its parent has not reaped yet does not."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: a signal of 0 tells only whether the PID exists
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def wait_for_exit(pids: tuple[int, ...], wait_s: float = WAIT_S, poll_s: float = 0.02) -> float:
    """Seconds waited until none of `pids` runs; StillRunning after `wait_s`."""
    started = time.monotonic()
    while running := [pid for pid in pids if alive(pid)]:
        waited = time.monotonic() - started
        if waited >= wait_s:
            raise StillRunning(f"the run this one replaces (PIDs {', '.join(map(str, running))}) "
                               f"still runs after {waited:.0f} s: not started")
        time.sleep(poll_s)
    return time.monotonic() - started
