"""A stop the operator asks for: SIGTERM or SIGINT ends the run cleanly after its current
step (training/loop.py saves and exits 0)."""
from __future__ import annotations

import signal
import time


class StopRequest:
    """SIGTERM / SIGINT ask for a clean stop after the current step.

    Once a stop is under way (this rank was asked, or another rank was and the step's
    all-reduce said so), SIGTERM is ignored until the process exits: torchrun's agent and
    a kill that signals every node send it again while the rank saves, writes its end
    event and leaves the process group, and its default action then would kill the rank
    mid-exit (ignored, it does not interrupt a system call either). SIGKILL remains the
    hard stop; SIGINT gets its handler back, so a second Ctrl-C at the terminal still
    interrupts."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.requested = False  # this process was signalled
        self.requested_at: float | None = None  # time.monotonic() of the first signal
        self._stopping = False
        self._previous = {sig: signal.signal(sig, self._handle) for sig in self.SIGNALS}

    def _handle(self, signum, frame) -> None:
        self.requested = True
        self.requested_at = self.requested_at or time.monotonic()

    def since(self) -> str:
        """Seconds since this process was signalled, for the stop path's lines."""
        return f"{time.monotonic() - self.requested_at:.2f} s after the signal" if self.requested_at else "(signalled elsewhere)"

    def under_way(self) -> None:
        """Every rank stops after this step."""
        self._stopping = True
        signal.signal(signal.SIGTERM, signal.SIG_IGN)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            if sig == signal.SIGTERM and (self._stopping or self.requested):
                handler = signal.SIG_IGN
            signal.signal(sig, handler)
