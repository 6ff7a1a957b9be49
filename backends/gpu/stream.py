"""Streaming a host's GPUs: one long-lived `nvidia-smi … -lms N` channel (NVML polled
in-process on a local host), reopened with backoff when it fails, so a GPU or host that
comes back is streamed again by itself."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from backends.gpu.read import read_gpus
from backends.gpu.smi import DEFAULT_SMI, parse_gpu_row, smi_argv
from backends.gpu.snapshot import GpuReading, GpuSnapshot, GpuStatus
from backends.hosts import Host, HostError
from backends.retry import Backoff

# The first wait before reopening a failed channel, and the longest (backends.retry).
STREAM_RETRY_S = 1.0
STREAM_RETRY_CAP_S = 30.0


class SampleGrouper:
    """Groups a `-lms` stream's rows into samples, one reading per GPU.

    nvidia-smi prints one row per GPU per interval with nothing between intervals, so a
    sample ends at the row of the highest GPU index, or, should a GPU have fallen off the
    bus, when the index sequence restarts (and the highest index is relearned).
    """

    def __init__(self, last_index: int):
        self.last_index = last_index
        self._batch: list[GpuReading] = []

    def push(self, row: GpuReading) -> list[tuple[GpuReading, ...]]:
        """Add a row; return the samples it completed (none, one, or rarely two)."""
        done = []
        if self._batch and row.index <= self._batch[-1].index:
            done.append(tuple(self._batch))
            self.last_index, self._batch = self._batch[-1].index, []
        self._batch.append(row)
        if row.index >= self.last_index:
            done.append(tuple(self._batch))
            self.last_index, self._batch = row.index, []
        return done


# Consecutive unreadable lines after which a `-lms` channel is judged broken and reopened.
MAX_BAD_LINES = 20


async def _stream_smi(host: Host, interval_ms: int, smi: str, last_index: int) -> AsyncIterator[GpuSnapshot]:
    """Snapshots from one `-lms` channel until it ends or turns to garbage.

    Raises HostError if the host is lost.
    """
    grouper = SampleGrouper(last_index)
    bad = 0
    lines = host.lines(smi_argv(smi, "-lms", str(interval_ms)))
    try:
        async for line in lines:
            row = parse_gpu_row(line)
            if row is None:
                bad += 1
                if bad >= MAX_BAD_LINES:
                    return
                continue
            bad = 0
            for sample in grouper.push(row):
                yield GpuSnapshot(GpuStatus.OK, gpus=sample, source="nvidia-smi", streamed=True)
    finally:
        await lines.aclose()


async def stream_gpus(
    host: Host, interval_ms: int, smi: str = DEFAULT_SMI, *, nvml: bool = True
) -> AsyncIterator[GpuSnapshot]:
    """Snapshots of `host`'s GPUs every `interval_ms`, forever; the caller closes the iterator.

    The first is a full `read_gpus` (with processes). After it, a local host with working
    NVML is polled in-process; any other is read over one `nvidia-smi … -lms N` channel
    (`streamed` snapshots, without per-process rows: `read_processes` reads those). When
    the channel fails or ends, the state it left (no nvidia-smi, driver error, unreachable
    host, …) is yielded and the channel reopened with backoff, so the stream resumes by
    itself when the GPU or host comes back.
    """
    backoff = Backoff(STREAM_RETRY_S, STREAM_RETRY_CAP_S)
    while True:
        snapshot = await read_gpus(host, smi, nvml=nvml)
        yield snapshot
        if snapshot.ok and snapshot.source == "nvml":
            await asyncio.sleep(interval_ms / 1000)
            continue
        streamed = False
        if snapshot.ok:
            try:
                async with contextlib.aclosing(_stream_smi(host, interval_ms, smi, snapshot.gpus[-1].index)) as samples:
                    async for sample in samples:
                        streamed = True
                        yield sample
            except HostError:
                pass  # the next read_gpus says what happened
        if streamed:
            backoff.succeeded()
            await asyncio.sleep(interval_ms / 1000)
        else:
            await asyncio.sleep(backoff.failed())
