"""What a reading of the GPU recording fetches and what it costs the event loop
(backends/recorder/reading.py, read.py's read_recording): a week of 8 GPUs read without
freezing the loop and within the cap, a reading on with a Cursor fetching only what was
appended, a day read from the line where `since` begins, a file of one endless line. Real
files in the recorder's format, read over the Host API (this machine's shell)."""

from __future__ import annotations

import asyncio
import time

from backends.hosts import LocalHost
from backends.recorder import layout, reading
from backends.recorder.read import Cursor, parse_recording, read_recording
from tests.backends.test_recorder_read import write_day_files

T0 = 1793836800.0  # 2026-11-05 00:00:00 UTC, in the past
DAY = layout.day_of(T0)
GPUS = 8
# The longest the loop may leave a 10 ms ticker waiting while a reading runs: 20-100 ms
# on this 2-core machine at a load of 7-9, more when it is busier; the whole parse on the
# loop, as before, left it 10-100 s (docs/benchmarks.md, "GPU recorder").
LOOP_GAP_S = 0.5


def samples(a: float, b: float, uuids: list[str] | None = None, step: float = 1.0) -> bytes:
    """The recorder's GPU lines from `a` to `b` for GPUS cards, each second (its -lms 1000),
    the cards declared first where `uuids` says."""
    out = [f"{a:.2f},{i},{uuids[i]}\n" for i in range(GPUS)] if uuids else []
    rows = [f",{i},312.50,700.00,80000,143771,97\n" for i in range(GPUS)]
    t = a
    while t < b:
        stamp = f"{t:.2f}"
        out.append("".join(stamp + row for row in rows))
        t += step
    return "".join(out).encode()


def uuids(tag: str) -> list[str]:
    return [f"GPU-{tag}{i:07d}-1111-2222-3333-444444444444" for i in range(GPUS)]


def ticks(a: float, b: float) -> bytes:
    return (f"{a:.2f},start,5\n" + "".join(f"{a + s:.2f}\n" for s in range(0, int(b - a), 5))).encode()


def snapshots(t: float) -> dict[str, bytes]:
    return {
        "procs": "".join(f"{t:.2f},{u},{4000 + i},98{i},25578,{3000 + i} 1\n" for i, u in enumerate(uuids("a"))).encode(),
        "panes": f"{t:.2f},ts,{3000},train\n".encode(),
        "logs": f"{t:.2f},10,r1/console.log\n".encode(),
    }


class Counting(LocalHost):
    """This machine as a host, counting the bytes its commands sent back."""

    fetched = 0

    async def chunks(self, argv):
        async for chunk in super().chunks(argv):
            self.fetched += len(chunk)
            yield chunk


async def ticking(work, period: float = 0.01) -> tuple[object, float]:
    """`work`'s result, and the longest the loop left a ticker waiting past its period meanwhile."""
    longest, done = 0.0, asyncio.Event()

    async def ticker() -> None:
        nonlocal longest
        last = time.monotonic()
        while not done.is_set():
            await asyncio.sleep(period)
            now = time.monotonic()
            longest, last = max(longest, now - last - period), now

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    try:
        result = await work
    finally:
        done.set()
        await task  # its last tick: a reading that held the loop to its end counts too
    return result, longest


def whole(directory, since: float, until: float | None, now: float | None = None):
    """The reading of every byte of every file: what read_recording must agree with."""
    return parse_recording({p.name: p.read_bytes() for p in directory.iterdir()}, since, until, now=now)


async def test_a_week_of_8_gpus_is_read_without_freezing_the_loop_and_within_the_cap(tmp_path):
    gpu = tmp_path / "runs" / "gpu"
    for d in range(7):
        t = T0 + d * 86400
        day = layout.day_of(t)
        write_day_files(gpu, {f"{day}.gpu": samples(t, t + 86400, uuids("a")), f"{day}.ticks": ticks(t, t + 86400)})
        write_day_files(gpu, {f"{day}.{kind}": data for kind, data in snapshots(t).items()})
    host = Counting(runs_root=str(tmp_path / "runs"))
    end = T0 + 7 * 86400 - 1
    rec, longest = await ticking(read_recording(host, T0, end))
    assert longest < LOOP_GAP_S
    # The first ~6 hours, cut where its cap ran out; each later file gave its floor at most.
    assert host.fetched <= reading.MAX_READ_BYTES + 35 * (reading.FLOOR_BYTES + 200)
    assert rec.read_to is not None and T0 + 3600 < rec.read_to < T0 + 86400
    first = parse_recording({f"{DAY}.{kind}": (gpu / f"{DAY}.{kind}").read_bytes() for kind in layout.KINDS}, T0, rec.read_to, now=rec.read_to)
    assert rec.gpus == first.gpus and rec.procs == first.procs and rec.gaps == first.gaps == ()


async def test_reading_on_fetches_only_what_was_appended(tmp_path):
    gpu = tmp_path / "runs" / "gpu"
    write_day_files(gpu, {f"{DAY}.gpu": samples(T0, T0 + 3600, uuids("a")), f"{DAY}.ticks": ticks(T0, T0 + 3600)})
    write_day_files(gpu, {f"{DAY}.{kind}": data for kind, data in snapshots(T0).items()})
    host, cursor = Counting(runs_root=str(tmp_path / "runs")), Cursor()
    first = await read_recording(host, T0, T0 + 3600, cursor=cursor)
    assert first == whole(gpu, T0, T0 + 3600)
    added = samples(T0 + 3600, T0 + 3610)
    with open(gpu / f"{DAY}.gpu", "ab") as f:
        f.write(added + f"{T0 + 3610:.2f},3,1".encode())  # a line being written: read next time
    with open(gpu / f"{DAY}.procs", "ab") as f:
        f.write(f"{T0 + 3605:.2f}\n".encode())  # the processes went
    host.fetched = 0
    since = T0 + 3600 - 5
    rec = await read_recording(host, since, T0 + 3610, cursor=cursor)
    assert host.fetched <= len(added) + 20 + 5 * 60  # the new bytes, and a header a file
    assert rec == whole(gpu, since, T0 + 3610)
    assert rec.procs_at(T0 + 3601) == whole(gpu, T0, None).procs_at(T0 + 3601) != () and rec.procs_at(T0 + 3606) == ()


async def test_a_day_is_read_from_where_since_begins(tmp_path):
    gpu = tmp_path / "runs" / "gpu"
    # A restart at 3 h declares other cards; hostile lines among the samples: too long,
    # garbage, and one out of time's order (a sample from 5 h 30 written at 1 h, half a
    # second off the samples then: one at a sample's time would be read as a copy of it).
    day = samples(T0, T0 + 3600, uuids("a"))
    day += f"{T0 + 5.5 * 3600 + 0.5:.2f},0,999.00,700.00,1,2,3\n".encode() + b"x" * 100_000 + b"\n\x00\xff,1,2\n"
    day += samples(T0 + 3600, T0 + 3 * 3600) + samples(T0 + 3 * 3600 + 30, T0 + 6 * 3600, uuids("b"))
    tick = ticks(T0, T0 + 3 * 3600) + ticks(T0 + 3 * 3600 + 30, T0 + 6 * 3600)
    write_day_files(gpu, {f"{DAY}.gpu": day, f"{DAY}.ticks": tick, **{f"{DAY}.{kind}": data for kind, data in snapshots(T0).items()}})
    host = Counting(runs_root=str(tmp_path / "runs"))
    since = T0 + 5 * 3600
    rec = await read_recording(host, since, T0 + 6 * 3600)
    after = len(samples(since, T0 + 6 * 3600))
    assert host.fetched < after + len(tick) + 1000 + 16384 + 2 * 8192  # the hour after since, not the day
    want = whole(gpu, since, T0 + 6 * 3600)
    assert rec.gpus == tuple(g for g in want.gpus if g.power_w != 999.0)  # the line out of order is not found
    assert {g.uuid for g in rec.gpus} == set(uuids("b"))
    assert (rec.procs, rec.panes, rec.logs, rec.gaps) == (want.procs, want.panes, want.logs, want.gaps)
    assert rec.read_to is None


async def test_a_file_of_one_endless_line_is_read_a_cap_at_a_time(tmp_path):
    gpu = tmp_path / "runs" / "gpu"
    endless = f"{T0:.2f}".encode() * 300_000  # 3.9 MB that looks like times, and no newline
    write_day_files(gpu, {f"{DAY}.gpu": endless + b"\n" + samples(T0 + 60, T0 + 70, uuids("a"))})
    host, cursor = Counting(runs_root=str(tmp_path / "runs")), Cursor()
    readings, since = [], T0
    while len(readings) < 8:
        host.fetched = 0
        rec, longest = await ticking(read_recording(host, since, T0 + 100, cursor=cursor, max_bytes=1 << 20))
        assert longest < LOOP_GAP_S and host.fetched <= (1 << 20) + 200
        readings.append(rec)
        if rec.read_to is None:
            break
    assert 4 <= len(readings) <= 5
    assert [g for r in readings for g in r.gpus] == list(whole(gpu, T0, T0 + 100).gpus)
    assert {g.time for r in readings for g in r.gpus} == {T0 + 60 + s for s in range(10)}


def test_what_a_cursor_keeps_costs_time_linear_in_its_bytes():
    lines = [f"{T0 + i:.2f},{i % 8},{i % 700},700,1,2,99" for i in range(200_000)]
    hostile = [*lines, *(["\\" * 4000] * 500), *([f"{T0:.2f}," + "1," * 1500] * 500)]
    for kind in layout.KINDS:
        started = time.process_time()
        reading.kept(kind, hostile, T0 + 100_000)
        assert time.process_time() - started < 5.0
    out = b"\036x 0 1 0 1\n1" * 500_000 + b"\036a 0 0 0 99999999999\n"
    started = time.process_time()
    fetched = reading.assemble(out, [], T0, Cursor())
    assert time.process_time() - started < 5.0 and fetched.files == {"x": b"1"}


async def test_over_ssh_a_day_is_read_from_since_then_on_from_the_cursor(sshd, tmp_path):
    """The same host command through the loopback sshd: the argv quoted once at its edge."""
    if not sshd.running:
        sshd.start()
    gpu = tmp_path / "runs" / "gpu"
    day = samples(T0, T0 + 3 * 3600, uuids("a")) + samples(T0 + 3 * 3600 + 30, T0 + 6 * 3600, uuids("b"))
    write_day_files(gpu, {f"{DAY}.gpu": day, f"{DAY}.ticks": ticks(T0, T0 + 6 * 3600), **{f"{DAY}.{k}": v for k, v in snapshots(T0).items()}})
    host = sshd.host(runs_root=str(tmp_path / "runs"))
    fetched = 0
    chunks = host.chunks

    async def counted(argv):
        nonlocal fetched
        async for chunk in chunks(argv):
            fetched += len(chunk)
            yield chunk

    host.chunks = counted
    try:
        cursor, since = Cursor(), T0 + 5.5 * 3600
        rec = await read_recording(host, since, T0 + 6 * 3600, cursor=cursor)
        assert rec == whole(gpu, since, T0 + 6 * 3600) and {g.uuid for g in rec.gpus} == set(uuids("b"))
        assert fetched < len(samples(since, T0 + 6 * 3600)) + 64 * 1024 + 16384 + 2 * 8192
        added = samples(T0 + 6 * 3600, T0 + 6 * 3600 + 5)
        with open(gpu / f"{DAY}.gpu", "ab") as f:
            f.write(added)
        fetched, since = 0, T0 + 6 * 3600 - 5
        rec = await read_recording(host, since, T0 + 6 * 3600 + 5, cursor=cursor)
        assert rec == whole(gpu, since, T0 + 6 * 3600 + 5) and fetched <= len(added) + 5 * 60
    finally:
        await host.close()
