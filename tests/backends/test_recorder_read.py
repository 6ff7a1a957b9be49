"""The reader of the GPU recording (backends/recorder/read.py) on bytes in the recorder's
format: samples, the snapshots in effect at `since`, the gaps; hostile day files (garbage,
huge lines, numbers out of range, links, another user's); read over the Host API."""

from __future__ import annotations

import os
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backends import runsroot
from backends.hosts import LocalHost
from backends.recorder import agent
from backends.recorder.read import Gap, GpuSample, LogSize, PaneSample, ProcSample, parse_recording, read_recording

T0 = 1793836800.0  # 2026-11-05 00:00:00 UTC, in the past
DAY = agent.day_of(T0)
UUID = "GPU-00000000-1111-2222-3333-444444444444"


def rows(*lines: str) -> bytes:
    return "".join(f"{line}\n" for line in lines).encode()


def day_files(t0: float = T0) -> dict[str, bytes]:
    """Ten minutes of one GPU, a restart at +300 s after 100 s of nothing."""
    gpu = [f"{t0:.2f},0,{UUID}"]
    ticks = [f"{t0:.2f},start,5"]
    for s in range(0, 600, 5):
        if 200 < s < 300:
            continue  # the recorder was dead
        if s == 300:
            ticks.append(f"{t0 + s:.2f},start,5")
            gpu.append(f"{t0 + s:.2f},0,{UUID}")
        gpu.append(f"{t0 + s:.2f},0,{100 + s},700.00,1000,143771,{99 if s < 400 else 10}")
        ticks.append(f"{t0 + s:.2f}")
    return {
        f"{DAY}.gpu": rows(*gpu),
        f"{DAY}.ticks": rows(*ticks),
        f"{DAY}.procs": rows(f"{t0:.2f}", f"{t0 + 100:.2f},{UUID},4242,987,25578,4000 1", f"{t0 + 400:.2f}"),
        f"{DAY}.panes": rows(f"{t0:.2f},,4000,train\\x2cme", f"{t0 + 100:.2f},ts,4000,train\\x2cme", f"{t0 + 100:.2f},,5000,other"),
        f"{DAY}.logs": rows(f"{t0:.2f},10,r1/console.log", f"{t0 + 50:.2f},20,r1/console.log", f"{t0 + 150:.2f},30,panes/default/x-1/3.log"),
    }


def test_samples_snapshots_and_the_gap_of_a_restart():
    rec = parse_recording(day_files(), T0 + 120, T0 + 500)
    assert rec.gpus[0] == GpuSample(T0 + 120, 0, UUID, 220.0, 700.0, 1000.0, 143771.0, 99.0)
    assert all(T0 + 120 <= g.time <= T0 + 500 for g in rec.gpus)
    # The snapshot in effect at `since` comes, from its own time, until the next.
    assert rec.procs == (ProcSample(T0 + 100, UUID, 4242, 987, 25578.0, (4000, 1)),)
    assert rec.procs_at(T0 + 399) == rec.procs and rec.procs_at(T0 + 401) == () and rec.procs_at(T0 + 99) == ()
    assert set(rec.panes_at(T0 + 120)) == {PaneSample(T0 + 100, "ts", "train,me", 4000), PaneSample(T0 + 100, "", "other", 5000)}
    assert rec.logs == (LogSize(T0 + 50, "r1/console.log", 20), LogSize(T0 + 150, "panes/default/x-1/3.log", 30))
    assert rec.log_size_at("r1/console.log", T0 + 400) == 20
    assert rec.gaps == (Gap(T0 + 200, T0 + 300),)
    assert rec.coarse_before is None


def test_a_recording_that_stopped_ends_in_a_gap_up_to_now():
    files = day_files()
    assert parse_recording(files, T0, None).gaps == (Gap(T0 + 200, T0 + 300),)
    assert parse_recording(files, T0, None, now=T0 + 3600).gaps[-1] == Gap(T0 + 595, T0 + 3600)
    assert parse_recording(files, T0 + 2000, None, now=T0 + 3600).gaps == (Gap(T0 + 595, T0 + 3600),)
    assert parse_recording({}, T0, None, now=T0 + 10).gaps == (Gap(T0, T0 + 10),)


def test_one_minute_means_count_as_samples_and_say_where_they_end():
    full = day_files()
    coarse = {f"{DAY}.{kind}.1m": "".join(f"{r}\n" for r in agent.downsample(kind, agent.lines(data))).encode()
              for name, data in full.items() for kind in [name.split(".")[1]]}  # fmt: skip
    rec = parse_recording(coarse, T0, None)
    assert rec.coarse_before == T0 + 86400
    minutes = [g.time for g in rec.gpus]
    assert minutes == sorted(set(minutes)) and all(t % 60 == 0 for t in minutes) and len(minutes) == 9
    assert rec.gpus[0].power_w == pytest.approx(100 + sum(range(0, 60, 5)) / 12)
    assert rec.gaps == (Gap(T0 + 180, T0 + 300),)  # the restart: a start marker is kept
    # Where a day is there in full and as means (mid-rotation), the full one is read.
    assert parse_recording({**coarse, **full}, T0, None).gpus == parse_recording(full, T0, None).gpus


HOSTILE_LINES = [
    b"x" * 100_000,  # a huge line
    f"{T0 + 1:.2f},0,{'9' * 400},700,1,2,3".encode(),  # a number out of any range
    f"{T0 + 1:.2f},0,nan,inf,-1,2,3".encode(),
    "1e309,0,1,2,3,4,5".encode(),
    f"{T0 + 1:.2f},99999999,1,2,3,4,5".encode(),
    f"{T0 + 1:.2f},0,1,2,3,4,5,6".encode(),
    "é,0,1,2,3,4,5".encode(),
    b"\x00\xff\x1b[2J",
    f"{T0 + 1:.2f},{UUID},-5,1,1,".encode(),  # a pid below 1
    f"{T0 + 1:.2f},{UUID},5,1,1,1 two 3".encode(),
    f"{T0 + 1:.2f},,5\\,x".encode(),  # an escape no recorder writes
]


def test_hostile_lines_are_skipped_and_the_good_ones_kept():
    good = day_files()
    hostile = {name: b"\n".join(HOSTILE_LINES) + b"\n" + data + b"\n".join(HOSTILE_LINES) + b"\n" for name, data in good.items()}
    hostile[f"{DAY}.evil"] = b"\n".join(HOSTILE_LINES)
    hostile["../../etc.gpu"] = good[f"{DAY}.gpu"]
    rec, want = parse_recording(hostile, T0, None), parse_recording(good, T0, None)
    assert rec.gpus[1:] == want.gpus[1:] and rec.procs == want.procs and rec.panes == want.panes and rec.logs == want.logs
    assert rec.gaps == want.gaps


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=3000), kind=st.sampled_from(agent.KINDS), since=st.floats(allow_nan=True))
def test_random_bytes_never_raise(data, kind, since):
    rec = parse_recording({f"{DAY}.{kind}": data, f"{DAY}.{kind}.1m": data}, since, None, now=T0)
    for gap in rec.gaps:
        assert gap.end >= gap.start


def test_reading_it_costs_time_linear_in_its_bytes():
    lines = rows(*(f"{T0 + i:.2f},0,{i % 700},700,1,2,99" for i in range(50_000)))
    for data in (lines, b"\\" * 2_000_000, b"1," * 1_000_000, b"\n" * 2_000_000):
        started = time.process_time()
        parse_recording({f"{DAY}.gpu": data, f"{DAY}.procs": data, f"{DAY}.panes": data, f"{DAY}.logs": data, f"{DAY}.ticks": data}, T0, None)
        assert time.process_time() - started < 5.0


def write_day_files(directory, files: dict[str, bytes]) -> None:
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    for name, data in files.items():
        (directory / name).write_bytes(data)
        (directory / name).chmod(0o600)


async def test_read_over_the_host_api_reads_the_overlapping_days_and_no_link(tmp_path):
    gpu = tmp_path / "runs" / "gpu"
    write_day_files(gpu, day_files())
    write_day_files(gpu, {f"{agent.day_of(T0 - 86400 * d)}.gpu": rows(f"{T0 - 86400 * d:.2f},0,1,2,3,4,5") for d in (1, 2, 3, 4, 5)})
    secret = tmp_path / "secret"
    secret.write_text(f"{T0 + 1:.2f},3,1,2,3,4,5\n")
    (gpu / f"{DAY}.gpu.1m").symlink_to(secret)  # a link is never followed
    (gpu / f"{agent.day_of(T0 + 86400)}.gpu").symlink_to(secret)
    other = gpu / f"{DAY}.ticks.1m"
    other.write_text(f"{T0 + 1:.2f},3,1,2,3,4,5\n")
    other.chmod(0o666)  # another user could have written it: left out
    host = LocalHost(runs_root=str(tmp_path / "runs"))
    rec = await read_recording(host, T0 - 86400, T0 + 2 * 86400)
    assert rec == parse_recording({**day_files(), f"{agent.day_of(T0 - 86400)}.gpu": rows(f"{T0 - 86400:.2f},0,1,2,3,4,5")}, T0 - 86400, T0 + 2 * 86400)
    assert {g.index for g in rec.gpus} == {0}
    os.chmod(gpu, 0o777)
    with pytest.raises(runsroot.RunsRootRefused, match="can be written by other users"):
        await read_recording(host, T0, T0 + 10)
    os.chmod(gpu, 0o700)
    empty = LocalHost(runs_root=str(tmp_path / "none"))
    assert (await read_recording(empty, T0, T0 + 10)).gpus == ()
