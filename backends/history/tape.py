"""A log as it was at a moment: its bytes now, and how long it was when (the recorder's
LogSize index), read back as the lines it held then.

A pane's recording is its scrollback (what the pane held when the recording began), the
older segment of its log (`.log.1`) and the live one: the tape is the three end to end.
The live file turns at its cap (backends/logs/recording.py), so a size recorded before a
turn measures the segment that is now `.1`; one recorded before two turns measures a
segment that is gone. A run dir's console.log never turns: its tape is the file alone.

Everything here is anyone's bytes: a size larger than the file (the file was changed
since) is held to the file, a line with no end is read at most MAX_TAIL_BYTES back, and
each line shown is what a terminal would show of it (backends/logs/screen.py, bounded).
"""

from __future__ import annotations

import bisect
import copy
from collections.abc import Iterable
from dataclasses import dataclass, field

from backends.logs import screen
from backends.logs.console import ConsoleSummary

MAX_TAIL_BYTES = 4 << 20  # read back at most this far for the lines shown
CHECKPOINT_BYTES = 1 << 20  # a console's fold is kept every this many bytes, to step back to


@dataclass(frozen=True)
class LogAt:
    """A log at a moment: its last lines then, and what to say about them ("" when whole)."""

    lines: tuple[str, ...]
    note: str = ""


@dataclass
class Tape:
    """A log's bytes and its size over time. `sizes` are the recording's (time, size of the
    live file) for this log, in any order."""

    path: str  # as the recording names it: relative to the runs root
    current: bytes = b""
    older: bytes = b""  # the segment it turned from (`.1`)
    before: bytes = b""  # a pane's scrollback, written as its recording began
    sizes: Iterable[tuple[float, int]] = ()
    clamped: int = field(init=False, default=0)  # sizes larger than their file (it changed since)

    def __post_init__(self) -> None:
        self.data = self.before + self.older + self.current
        self.times, self.offsets = self._index(sorted(self.sizes))
        self._folds: list[tuple[int, ConsoleSummary]] = []  # (offset, fold up to it), ascending

    def _index(self, sizes: list[tuple[float, int]]) -> tuple[list[float], list[int | None]]:
        """Each recorded size as an offset into the tape; None where its segment is gone."""
        turns = 0
        after = [0] * len(sizes)  # turns after each record: a size smaller than the one before
        for i in range(len(sizes) - 1, -1, -1):
            after[i] = turns
            if i and sizes[i][1] < sizes[i - 1][1]:
                turns += 1
        if sizes and self.older and len(self.current) < sizes[-1][1]:  # turned after the last record
            after = [n + 1 for n in after]
        lead = len(self.before)
        offsets: list[int | None] = []
        for (_, size), turned in zip(sizes, after):
            if turned == 0:
                base, length = lead + len(self.older), len(self.current)
            elif turned == 1 and self.older:
                base, length = lead, len(self.older)
            else:
                offsets.append(None)
                continue
            if size > length:
                self.clamped += 1
            offsets.append(base + max(0, min(size, length)))
        return [t for t, _ in sizes], offsets

    @property
    def recorded(self) -> bool:
        """Whether the recording indexed this log's size at all."""
        return bool(self.times)

    @property
    def first_time(self) -> float | None:
        return self.times[0] if self.times else None

    @property
    def last_time(self) -> float | None:
        return self.times[-1] if self.times else None

    def offset_at(self, when: float) -> tuple[int | None, str]:
        """The tape's length at `when`, with what to say about it; None: unknown."""
        i = bisect.bisect_right(self.times, when) - 1
        if i < 0:
            if self.before:
                return len(self.before), "before this log's recording began: what the pane held then"
            return None, "before this log's recording began"
        offset = self.offsets[i]
        if offset is None:
            return None, "the log of this moment has rotated away (two segments are kept)"
        return offset, ""

    def log_at(self, when: float, count: int) -> LogAt:
        """The last `count` lines of the log at `when`."""
        offset, note = self.offset_at(when)
        if offset is None:
            return LogAt((), note)
        if self.clamped and not note:
            note = f"{self.clamped} of the recording's sizes were past the file's end (it changed since): held to it"
        return LogAt(tail_lines(self.data, offset, count), note)

    def whole(self, count: int) -> LogAt:
        return LogAt(tail_lines(self.data, len(self.data), count))

    def console_at(self, when: float) -> ConsoleSummary | None:
        """What the log said up to `when`, folded (backends/logs/console.py); None where the
        log at `when` is unknown."""
        offset, _ = self.offset_at(when)
        return None if offset is None else self.console_to(offset)

    def console_to(self, offset: int) -> ConsoleSummary:
        """The fold of the tape's whole lines before `offset`, from the nearest fold kept
        (stepping forward folds only what is new, back from a fold a MiB apart at most)."""
        end = self.data.rfind(b"\n", 0, offset) + 1
        k = bisect.bisect_right([at for at, _ in self._folds], end) - 1
        at, fold = self._folds[k] if k >= 0 else (0, ConsoleSummary())
        fold = copy.deepcopy(fold)
        while at < end:
            stop = min(end, at + CHECKPOINT_BYTES)
            stop = self.data.rfind(b"\n", at, stop) + 1 or end  # whole lines, so no character is cut
            fold.add_recorded(self.data[at:stop].decode(errors="replace"))
            at = stop
            if not self._folds or at >= self._folds[-1][0] + CHECKPOINT_BYTES:
                self._folds.append((at, copy.deepcopy(fold)))
        fold.settle()
        return fold


def tail_lines(data: bytes, end: int, count: int) -> tuple[str, ...]:
    """The last `count` lines of `data[:end]`, each as a terminal shows it; at most
    MAX_TAIL_BYTES read back (a line that never ends is shown cut)."""
    floor = max(0, end - MAX_TAIL_BYTES)
    pos = end - 1 if end and data[end - 1 : end] == b"\n" else end  # the last line's own end is no line
    start = floor
    for _ in range(count):
        found = data.rfind(b"\n", floor, pos)
        if found < 0:
            start = floor
            break
        pos, start = found, found + 1
    text = data[start:end].decode(errors="replace")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return tuple(screen.visible_text(line) for line in lines[-count:])
