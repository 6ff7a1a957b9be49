"""Messages the host monitors post to the app. The app folds them into `tui.state`.

Polled snapshots replace an older one of the same host still waiting in the queue (only
the newest matters); batches of lines never replace each other (no line may be lost).
"""

from __future__ import annotations

from textual.message import Message

from backends.gpu import GpuSnapshot


class HostMessage(Message):
    def __init__(self, host: str) -> None:
        super().__init__()
        self.host = host


class GpusPolled(HostMessage):
    def __init__(self, host: str, snapshot: GpuSnapshot, time: float) -> None:
        super().__init__(host)
        self.snapshot = snapshot
        self.time = time

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, GpusPolled) and message.host == self.host


class RunsListed(HostMessage):
    def __init__(self, host: str, runs: list, time: float) -> None:
        super().__init__(host)
        self.runs = runs
        self.time = time

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, RunsListed) and message.host == self.host


class EnergyMetered(HostMessage):
    """A host's recording read: its runs' charges (run key → backends.recorder.energy.Charge),
    or why none has one, as (a short word, the words)."""

    def __init__(self, host: str, charges: dict, why: tuple[str, str] | None) -> None:
        super().__init__(host)
        self.charges = charges
        self.why = why

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, EnergyMetered) and message.host == self.host


class HostFailed(HostMessage):
    """A poll failed; status is offline, auth or error, message says why in words."""

    def __init__(self, host: str, status: str, message: str) -> None:
        super().__init__(host)
        self.status = status
        self.message = message


class MetricsBatch(HostMessage):
    """Events parsed from a run's metrics.jsonl since the last batch."""

    def __init__(self, host: str, key: str, events: list[dict], garbled: int) -> None:
        super().__init__(host)
        self.key = key
        self.events = events
        self.garbled = garbled


class OverlaysRead(Message):
    """Runs to draw behind run `key` (run key → backends.logs.series.Overlay), read by a worker;
    `drop`, a run key to draw no longer."""

    def __init__(self, key: str, overlays: dict, drop: str | None = None) -> None:
        super().__init__()
        self.key = key
        self.overlays = overlays
        self.drop = drop


class ConsoleBatch(HostMessage):
    """Lines of a run's console.log since the last batch."""

    def __init__(self, host: str, key: str, lines: list[str]) -> None:
        super().__init__(host)
        self.key = key
        self.lines = lines
