"""A run's whole life on one time axis: its host's GPUs' power and memory from the
recording (backends/recorder), cut into as many spans as a chart has columns.

The figures are the host's cards' (their sum), said so where drawn: a card is charged to a
run only by its processes' ancestry (backends/recorder/energy.py), not here. A span with no
sample (the recorder down, or not yet started) is None: a gap, never filled in.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Life:
    start: float
    end: float
    power_w: tuple[float | None, ...]  # per span: the cards' summed draw (each card's mean over the span)
    mem_gib: tuple[float | None, ...]  # per span: the cards' summed memory in use
    limit_w: float | None  # the cards' summed power limit, as last sampled
    total_gib: float | None  # the cards' summed memory
    cards: int  # how many cards the recording holds

    def at(self, span: int) -> float:
        """The time at the middle of span `span`."""
        width = (self.end - self.start) / max(1, len(self.power_w))
        return self.start + (span + 0.5) * width


def life_of(recording, start: float, end: float, spans: int) -> Life:
    """`recording`'s GPU samples from `start` to `end` in `spans` spans (at least one)."""
    spans = max(1, spans)
    width = max(1e-9, (end - start) / spans)
    sums: list[dict[int, list[float]]] = [{} for _ in range(spans)]  # span → card → [power, mem, count]
    limits: dict[int, float] = {}
    totals: dict[int, float] = {}
    for s in recording.gpus:
        if not start <= s.time <= end:
            continue
        k = min(spans - 1, int((s.time - start) / width))
        acc = sums[k].setdefault(s.index, [0.0, 0.0, 0, 0])
        if s.power_w is not None:
            acc[0] += s.power_w
            acc[2] += 1
        if s.mem_used_mib is not None:
            acc[1] += s.mem_used_mib
            acc[3] += 1
        if s.power_limit_w is not None:
            limits[s.index] = s.power_limit_w
        if s.mem_total_mib is not None:
            totals[s.index] = s.mem_total_mib
    power = tuple(sum(a[0] / a[2] for a in span.values() if a[2]) if any(a[2] for a in span.values()) else None for span in sums)
    mem = tuple(sum(a[1] / a[3] for a in span.values() if a[3]) / 1024 if any(a[3] for a in span.values()) else None for span in sums)
    cards = len({s.index for s in recording.gpus})
    return Life(start, end, power, mem, sum(limits.values()) or None, sum(totals.values()) / 1024 or None, cards)


def read_on(older, newer):
    """A recording read on: `older`, then `newer`, which was read from `older`'s last GPU
    sample (so a screen showing a run of days reads only what is new). A gap of `older`
    that reached that sample or after (the recorder quiet when it was read) is `newer`'s
    to say again."""
    last = last_sample(older)
    if last is None:
        return newer
    return replace(
        newer,
        gpus=(*older.gpus, *(g for g in newer.gpus if g.time > last)),
        logs=(*older.logs, *(s for s in newer.logs if s.time > last)),
        gaps=(*(g for g in older.gaps if g.end <= last), *newer.gaps),
        coarse_before=older.coarse_before if older.coarse_before is not None else newer.coarse_before,
    )


def last_sample(recording) -> float | None:
    return max((g.time for g in recording.gpus), default=None) if recording is not None else None
