"""Per-host monitors: workers that poll and follow through `backends` and post messages.

One poll loop per host does GPUs then (every few ticks) the run listing, and sleeps only
after both finished, so polls of one host never overlap and a slow host is polled slower
rather than piled up. Each followed file has its own worker that buffers lines and posts
them in batches every FLUSH_S, so a run printing thousands of lines a second costs the UI
four messages a second per file. Nothing here touches widgets.
"""

from __future__ import annotations

import asyncio
import posixpath
import time
from collections.abc import Callable

from textual.app import App
from textual.worker import Worker

from backends import gpu, logparse, runs, streams, tmux
from backends.hosts import AuthFailed, Host, HostError, HostKeyRejected, HostUnreachable
from tui.messages import ConsoleBatch, GpusPolled, HostFailed, MetricsBatch, RunsListed

FLUSH_S = 0.25  # each batch scrolls the log and lays the screen out again: 4 a second reads as live
POLL_TIMEOUT_S = 20.0
FOLLOW_RETRY_S = 2.0


def failure_status(error: BaseException) -> tuple[str, str]:
    """How a failed poll reads in the fleet: (status, message in words)."""
    if isinstance(error, (AuthFailed, HostKeyRejected)):
        return "auth", str(error)
    if isinstance(error, HostUnreachable):
        return "offline", str(error)
    if isinstance(error, (TimeoutError, asyncio.TimeoutError)):
        return "offline", f"no answer within {POLL_TIMEOUT_S:.0f}s"
    if isinstance(error, HostError):
        return "error", str(error)
    return "error", f"{type(error).__name__}: {error}"


def new_lines(previous: list[str], current: list[str]) -> list[str]:
    """The lines of a pane capture that the previous capture did not show: `current` after
    the longest prefix of it that ends `previous` (the pane scrolled by that much)."""
    for overlap in range(min(len(previous), len(current)), 0, -1):
        if previous[-overlap:] == current[:overlap]:
            return current[overlap:]
    return current


class HostMonitor:
    def __init__(
        self,
        app: App,
        host: Host,
        *,
        smi: str = "nvidia-smi",
        interval: float = 1.0,
        runs_every: int = 2,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.app = app
        self.host = host
        self.smi = smi
        self.interval = interval
        self.runs_every = runs_every
        self.clock = clock
        self._followers: dict[str, list[Worker]] = {}
        self._poller: Worker | None = None
        self._tick = 0  # polls done; runs are listed on every runs_every-th

    def start(self) -> None:
        self._poller = self.app.run_worker(
            self._poll(), name=f"poll {self.host.name}", group="monitor", exit_on_error=False
        )

    def stop(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
        for key in list(self._followers):
            self.unfollow(key)

    def poll_runs_now(self) -> None:
        """Ask for a run listing on the next tick (after a launch or a kill)."""
        self._tick = 0

    async def _poll(self) -> None:
        while True:
            started = time.monotonic()
            try:
                if self._tick % self.runs_every == 0:
                    listed = await asyncio.wait_for(runs.list_runs(self.host), POLL_TIMEOUT_S)
                    self.app.post_message(RunsListed(self.host.name, listed, self.clock()))
                snapshot = await asyncio.wait_for(gpu.read_gpus(self.host, self.smi), POLL_TIMEOUT_S)
                self.app.post_message(GpusPolled(self.host.name, snapshot, self.clock()))
            except asyncio.CancelledError:
                raise
            except Exception as error:  # a host's trouble is state, never a crash
                status, message = failure_status(error)
                self.app.post_message(HostFailed(self.host.name, status, message))
            self._tick += 1
            await asyncio.sleep(max(0.0, self.interval - (time.monotonic() - started)))

    def follow(self, key: str, run_dir: str | None, session: str) -> bool:
        """Follow a run's metrics.jsonl and console.log, or, for a tmux session trackside
        did not launch (no run dir), what its pane shows. False if already followed."""
        if key in self._followers:
            return False
        if run_dir is None:
            jobs = [(self._watch_pane(key, session), f"pane {session}")]
        else:
            jobs = [
                (self._follow(key, posixpath.join(run_dir, name), batch), f"{key} {name}")
                for name, batch in (("metrics.jsonl", self._metrics_batch), ("console.log", self._console_batch))
            ]
        self._followers[key] = [
            self.app.run_worker(job, name=f"follow {what}", group="monitor", exit_on_error=False)
            for job, what in jobs
        ]
        return True

    def unfollow(self, key: str) -> None:
        for worker in self._followers.pop(key, []):
            worker.cancel()

    def following(self) -> set[str]:
        return set(self._followers)

    def _metrics_batch(self, key: str, lines: list[str]) -> MetricsBatch:
        events, garbled = [], 0
        for line in lines:
            if not line.strip():
                continue
            event = logparse.parse_metrics_line(line)
            if event is None:
                garbled += 1
            else:
                events.append(event)
        return MetricsBatch(self.host.name, key, events, garbled)

    def _console_batch(self, key: str, lines: list[str]) -> ConsoleBatch:
        return ConsoleBatch(self.host.name, key, lines)

    async def _follow(self, key: str, path: str, batch: Callable) -> None:
        buffer: list[str] = []
        offset = 0

        async def pump() -> None:
            nonlocal offset
            async for line in streams.follow(self.host, path, offset):
                buffer.append(line.text)
                offset = line.end_offset

        while True:
            task = asyncio.create_task(pump())
            try:
                while not task.done():
                    await asyncio.sleep(FLUSH_S)
                    self._flush(key, buffer, batch)
                self._flush(key, buffer, batch)
                task.result()
            except asyncio.CancelledError:
                raise
            except Exception as error:
                # streams.follow resumes by itself after drops; this is anything else.
                self.app.post_message(
                    ConsoleBatch(self.host.name, key, [f"[trackside] following {path}: {error}"])
                )
            finally:
                # Wait for the stream's own clean-up (it stops the remote tail) to finish.
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            await asyncio.sleep(FOLLOW_RETRY_S)

    async def _watch_pane(self, key: str, session: str) -> None:
        previous: list[str] = []
        while True:
            started = time.monotonic()
            try:
                text = await asyncio.wait_for(tmux.capture_pane(self.host, session), POLL_TIMEOUT_S)
            except asyncio.CancelledError:
                raise
            except Exception:
                text = None  # the session or host is gone: the listing says so
            if text is not None:
                current = text.rstrip("\n").split("\n")
                fresh = new_lines(previous, current)
                previous = current
                if fresh:
                    self.app.post_message(ConsoleBatch(self.host.name, key, fresh))
            await asyncio.sleep(max(0.0, self.interval - (time.monotonic() - started)))

    def _flush(self, key: str, buffer: list[str], batch: Callable) -> None:
        if buffer:
            lines = buffer[:]
            buffer.clear()
            self.app.post_message(batch(key, lines))
