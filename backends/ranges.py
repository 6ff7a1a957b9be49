"""The range of every number the operator sets: the config file's, and each flag's that
gives the same value (`trackside kill --grace`, `watch --interval`, `serve --port`).

Each is finite, of its kind, with a floor and a ceiling: wide enough for any real use,
narrow enough that none is a setting meaning "never" or "at once". Unchecked, `grace_s =
inf` was a kill that never sends SIGKILL and `poll_ms = 1e17` a fleet that never refreshes
and still says "ok".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Bounds:
    kind: type  # int or float
    low: float
    high: float
    unit: str = ""  # what it counts: "seconds", "ms", "MiB"

    @property
    def expected(self) -> str:
        what = "an integer" if self.kind is int else "a number"
        return f"expected {what} from {self.low:g} to {self.high:g}" + (f" {self.unit}" if self.unit else "")

    def check(self, given: Any) -> int | float:
        """`given` as this kind; ValueError saying what was expected if it is none in range."""
        kinds = int if self.kind is int else (int, float)
        if isinstance(given, bool) or not isinstance(given, kinds) or not math.isfinite(given) or not self.low <= given <= self.high:
            raise ValueError(self.expected)
        return self.kind(given)


GRACE = Bounds(float, 1, 3600, "seconds")  # SIGTERM to SIGKILL; a longer save is stopped by hand
POLL_MS = Bounds(int, 50, 60_000, "ms")  # the dashboard's refresh
WATCH_INTERVAL = Bounds(float, 0.05, 3600, "seconds")  # `trackside watch`'s polls
WATCH_SINCE = Bounds(float, 1, 400 * 86400, "seconds")  # `trackside watch --since`: the reader's MAX_DAYS at most
PORT = Bounds(int, 1, 65535)
MAX_CHANNELS = Bounds(int, 1, 64)  # SSH channels at once (sshd's default allows 10)
SYNC_MIB = Bounds(float, 0.01, 65536, "MiB")  # what a synced directory may hold
ALERT_TIMEOUT = Bounds(float, 0.1, 3600, "seconds")  # an alert command's time before it is killed
STALL_FLOOR = Bounds(float, 1, 7 * 86400, "seconds")
UNDERFED = Bounds(float, 1, 86400, "seconds")
NPROC_PER_NODE = Bounds(int, 1, 1024)  # `launch --hosts`' processes a host (a GPU each, as a rule)
MAX_VIEWERS = Bounds(int, 1, 100)  # `serve`'s open pages (docs/serve.md: each polls every host)
