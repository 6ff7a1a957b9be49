"""The one backoff policy for anything retried after a failure: a host's SSH connection, a
followed file, a GPU stream, the dashboard's followers.

The delay starts at `first` seconds and doubles with each consecutive failure up to
`cap`; a success starts it over. Doubling finds a host that is back within about the time
it was away, and the cap bounds how long a return goes unnoticed.
"""

from __future__ import annotations


class Backoff:
    def __init__(self, first: float, cap: float):
        self.first = first
        self.cap = cap
        self.failures = 0  # consecutive, since the last success

    def failed(self) -> float:
        """Count a failure; the seconds to wait before the next attempt."""
        self.failures += 1
        return min(self.first * 2 ** (self.failures - 1), self.cap)

    def succeeded(self) -> None:
        self.failures = 0
