"""Per-host monitors: workers that poll and follow through `backends` and post messages.

A host's GPUs come from one long-lived stream (`backends.gpu.stream_gpus`: one
`nvidia-smi -lms` channel), not a poll a second: each poll opened two SSH channels and
started nvidia-smi twice on the host, and the channels' cyclic garbage fed the app's
collector (docs/load.md, "What holds the figures"). The run listing, with a refresh of the per-process
rows that streamed samples lack, is polled by its own loop, which sleeps only after a
listing finished, so listings of one host never overlap and a slow host is listed slower
rather than piled up. Each followed file has its own worker that buffers lines and posts
them in batches every FLUSH_S, so a run printing thousands of lines a second costs the UI
four messages a second per file. Nothing here touches widgets.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import posixpath
import time
from collections.abc import Callable

from textual.app import App
from textual.worker import Worker

from backends import gpu, runs, tmux
from backends.hosts import AuthFailed, Host, HostError, HostKeyRejected, HostUnreachable
from backends.logs import logparse, panes, streams
from backends.recorder.energy import UNKNOWN_START_S, Ledger, RunIdentity
from backends.recorder.read import Cursor, read_recording
from backends.retry import Backoff
from backends.runs.rundir import epoch
from tui.messages import ConsoleBatch, EnergyMetered, GpusPolled, HostFailed, MetricsBatch, RunsListed
from tui.state import HostStatus

FLUSH_S = 0.25  # each batch scrolls the log and lays the screen out again: 4 a second reads as live
PANE_LINES = 200  # a foreign pane's later captures: its screen and what scrolled off it since
POLL_TIMEOUT_S = 20.0
# A follower that failed other than by a drop (streams.follow rides those out) starts again
# after these many seconds, doubling while it keeps failing before any line arrives: each
# failure is a line in the run's log.
FOLLOW_RETRY_S = 2.0
FOLLOW_RETRY_CAP_S = 30.0
# The energy worker waits this many times its last reading's length, at least: parsed off
# the app's loop, a reading still takes the app's one interpreter from it by turns.
READ_SHARE = 4


def failure_status(error: BaseException) -> tuple[HostStatus, str]:
    """How a failed poll reads in the fleet: (status, message in words)."""
    if isinstance(error, (AuthFailed, HostKeyRejected)):
        return HostStatus.AUTH, str(error)
    if isinstance(error, HostUnreachable):
        return HostStatus.OFFLINE, str(error)
    if isinstance(error, (TimeoutError, asyncio.TimeoutError)):
        return HostStatus.OFFLINE, f"no answer within {POLL_TIMEOUT_S:.0f}s"
    if isinstance(error, HostError):
        return HostStatus.ERROR, str(error)
    return HostStatus.ERROR, f"{type(error).__name__}: {error}"


def new_lines(previous: list[str], current: list[str]) -> list[str]:
    """The lines of a pane capture that the previous capture did not show: `current` after
    the longest prefix of it that ends `previous` (the pane scrolled by that much)."""
    for overlap in range(min(len(previous), len(current)), 0, -1):
        if previous[-overlap:] == current[:overlap]:
            return current[overlap:]
    return current


def pane_news(previous: list[str], current: list[str]) -> list[str]:
    """What a pane capture adds to the previous one (both non-empty, or previous empty).

    A pane's last line is drawn over in place (a tqdm bar under HF Trainer's loss dicts), so
    it is compared apart from the lines above it: a redraw passes on once, and does not
    make every line look new. Each capture's last line has been passed on by its end.
    """
    fresh = new_lines(previous[:-1], current[:-1])
    shown = previous[-1] if previous else None
    scrolled = bool(fresh) and fresh[0] == shown  # the last line moved up as it was
    if scrolled:
        fresh = fresh[1:]
    if scrolled or current[-1] != shown:
        fresh.append(current[-1])
    return fresh


class HostMonitor:
    def __init__(
        self,
        app: App,
        host: Host,
        *,
        smi: str = gpu.DEFAULT_SMI,
        interval: float,  # seconds between polls: the config's poll_ms, where its default is
        runs_every: int = 2,
        clock: Callable[[], float] = time.time,
        record: bool = True,  # the host's recorder runs (its config's `record`)
    ) -> None:
        self.app = app
        self.host = host
        self.smi = smi
        self.interval = interval
        self.runs_every = runs_every  # runs are listed every runs_every intervals
        self.clock = clock
        self._followers: dict[str, list[Worker]] = {}
        self._gpu_watcher: Worker | None = None
        self._lister: Worker | None = None
        self._list_now = asyncio.Event()
        self._recordings = panes.Recordings()  # foreign panes' recorded output, read on each listing
        self._latest: gpu.GpuSnapshot | None = None  # the last snapshot the stream gave
        self._processes: tuple[tuple[gpu.GpuProcess, ...], str] = ((), "")  # the newest read of them
        self.record = record
        self._meter: Worker | None = None
        self._panes_seen: dict[str, set[int]] = {}  # run key → its panes' pids, as listings named them

    def start(self) -> None:
        self._watch_gpus_now()
        self._lister = self.app.run_worker(
            self._poll_runs(), name=f"runs {self.host.name}", group="monitor", exit_on_error=False
        )
        self._meter = self.app.run_worker(
            self._meter_energy(), name=f"energy {self.host.name}", group="monitor", exit_on_error=False
        )

    def stop(self) -> None:
        for worker in (self._gpu_watcher, self._lister, self._meter):
            if worker is not None:
                worker.cancel()
        for key in list(self._followers):
            self.unfollow(key)

    def poll_runs_now(self) -> None:
        """List runs (and GPU processes) now, not at the next period (after a launch or a kill)."""
        self._list_now.set()

    def _watch_gpus_now(self) -> None:
        """(Re)start the GPU stream: its first snapshot is read at once."""
        if self._gpu_watcher is not None:
            self._gpu_watcher.cancel()
        self._gpu_watcher = self.app.run_worker(
            self._watch_gpus(), name=f"gpus {self.host.name}", group="monitor", exit_on_error=False
        )

    async def _watch_gpus(self) -> None:
        interval_ms = max(1, round(self.interval * 1000))
        while True:
            async with contextlib.aclosing(gpu.stream_gpus(self.host, interval_ms, self.smi)) as snapshots:
                while True:
                    # While it streams, a silent channel is a hung one (a wedged driver): open
                    # a new one, whose first read times out into a state. After a failure the
                    # stream is backing off, which may be longer than any timeout here.
                    streaming = self._latest is not None and self._latest.ok
                    try:
                        async with asyncio.timeout(POLL_TIMEOUT_S if streaming else None):
                            snapshot = await anext(snapshots)
                    except TimeoutError:
                        self._latest = None
                        break
                    self._latest = snapshot
                    self.app.post_message(GpusPolled(self.host.name, self._with_processes(snapshot), self.clock()))

    async def _gpu_pids(self) -> set[int]:
        """The pids holding GPU memory, as last read: the listing asks which pane runs a trainer."""
        latest = self._processes[0] if self._latest is not None and self._latest.streamed else getattr(self._latest, "processes", ())
        return {p.pid for p in latest}

    def _with_processes(self, snapshot: gpu.GpuSnapshot) -> gpu.GpuSnapshot:
        """A streamed sample with the newest per-process rows read (the kill dialog names
        the GPUs a run's PIDs hold); a full read's own rows become the newest."""
        if snapshot.streamed:
            processes, message = self._processes
            return dataclasses.replace(snapshot, processes=processes, message=message)
        if snapshot.ok:
            self._processes = snapshot.processes, snapshot.message
        return snapshot

    async def _poll_runs(self) -> None:
        failed = False
        while True:
            started = time.monotonic()
            self._list_now.clear()
            try:
                async with asyncio.timeout(POLL_TIMEOUT_S):
                    listed = await runs.list_runs(self.host, self._recordings, self._gpu_pids)
                self.app.post_message(RunsListed(self.host.name, listed, self.clock()))
                if self._latest is not None and self._latest.streamed:
                    async with asyncio.timeout(POLL_TIMEOUT_S):
                        self._processes = await gpu.read_processes(self.host, self._latest.gpus, self.smi)
            except asyncio.CancelledError:
                raise
            except Exception as error:  # a host's trouble is state, never a crash
                failed = True
                status, message = failure_status(error)
                self.app.post_message(HostFailed(self.host.name, status, message))
            else:
                if failed:
                    # The host is back: read its GPUs now, not when the stream's backoff
                    # (up to 30 s) next tries, so it reads as back within a listing.
                    failed = False
                    self._watch_gpus_now()
            period = self.interval * self.runs_every
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, period - (time.monotonic() - started))):
                    await self._list_now.wait()

    def _identities(self) -> dict[str, RunIdentity]:
        """This host's runs as its recording knows them: the pane trackside's manifest
        names, or every pane a listing has named of a session it did not launch (charged
        from UNKNOWN_START_S ago: when it began is not known); a run with neither is none."""
        name, socket = self.host.name, self.host.tmux_socket or ""
        found = {}
        for key, run in self.app.runs.items():
            info = run.info
            node = next((n for n in info.nodes if n.host == name), None)
            if name not in run.hosts or (info.nodes and node is None):
                continue
            seen = self._panes_seen.setdefault(key, set())
            seen.update(node.pids if node is not None else info.pids)
            if info.pane_pid is not None and info.host == name:
                seen.add(info.pane_pid)
            session = node.session if node is not None else info.session
            if seen and session:
                since = epoch(info.started) if info.started else None
                found[key] = RunIdentity(socket, session, frozenset(seen), self.clock() - UNKNOWN_START_S if since is None else since)
        return found

    async def _meter_energy(self) -> None:
        """Each run's GPU time and energy so far, from the host's recording: read on from
        the last reading (backends.recorder.energy.Ledger), fetching only what the recorder
        appended since (a Cursor), at most one a poll interval, the next scheduled only once
        one has ended (a slow host or a long recording is read slower, never piled up);
        after a failure, later each time."""
        name = self.host.name
        ledger, cursor, said = Ledger(), Cursor(), None
        retry = Backoff(self.interval, FOLLOW_RETRY_CAP_S)
        while True:
            wait, news = self.interval, None
            runs_here = self._identities()
            if not self.record:
                news = ({}, ("off", f"not recorded: the recorder is off for {name} (record = false)"))
            elif runs_here:
                began = time.monotonic()
                try:
                    async with asyncio.timeout(POLL_TIMEOUT_S):
                        recording = await read_recording(self.host, ledger.read_from(runs_here), cursor=cursor)
                    ledger.add(recording, runs_here)
                    wait = max(wait, READ_SHARE * (time.monotonic() - began))
                except asyncio.CancelledError:
                    raise
                except Exception as error:  # the figures so far stay; a host's trouble is the listing's to say
                    wait = retry.failed()
                    news = (ledger.said(), None) if ledger.charges else ({}, ("none", f"cannot read the recording on {name}: {error}"))
                else:
                    why = None
                    if ledger.done == -math.inf:  # nothing recorded yet (not started): asked later each time
                        wait, why = retry.failed(), ("none", f"the recorder on {name} has not recorded anything yet")
                    else:
                        retry.succeeded()
                    news = (ledger.said(), why)
            # Said again when it changed, or a run came or went (the store gives it each run).
            if news is not None and (set(self.app.runs), news) != said:
                said = set(self.app.runs), news
                self.app.post_message(EnergyMetered(name, *news))
            await asyncio.sleep(wait)

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
        retry = Backoff(FOLLOW_RETRY_S, FOLLOW_RETRY_CAP_S)

        async def pump() -> None:
            nonlocal offset
            async for line in streams.follow(self.host, path, offset):
                buffer.append(line.text)
                offset = line.end_offset
                retry.succeeded()

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
            await asyncio.sleep(retry.failed())

    async def _watch_pane(self, key: str, session: str) -> None:
        previous: list[str] = []
        lines = tmux.HISTORY_LINES  # the first capture reads the scrollback: the run so far
        while True:
            started = time.monotonic()
            try:
                async with asyncio.timeout(POLL_TIMEOUT_S):
                    text = await tmux.capture_pane(self.host, session, lines)
            except asyncio.CancelledError:
                raise
            except Exception:
                text = None  # the session or host is gone: the listing says so
            if text is not None and text.strip():
                current = text.rstrip("\n").split("\n")
                fresh = pane_news(previous, current)
                previous, lines = current, PANE_LINES
                if fresh:
                    self.app.post_message(ConsoleBatch(self.host.name, key, fresh))
            await asyncio.sleep(max(0.0, self.interval - (time.monotonic() - started)))

    def _flush(self, key: str, buffer: list[str], batch: Callable) -> None:
        if buffer:
            lines = buffer[:]
            buffer.clear()
            self.app.post_message(batch(key, lines))
