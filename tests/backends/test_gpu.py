"""GPU telemetry: the parsers on real H200 output, property tests, the typed states through a
real LocalHost running tests/fake_nvidia_smi.py as `nvidia-smi`, and (on a GPU box) NVML
against nvidia-smi."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backends import gpu
from backends.gpu import (
    QUERY_GPU_FIELDS,
    GpuProcess,
    GpuReading,
    GpuStatus,
    SampleGrouper,
    parse_app_row,
    parse_compute_apps,
    parse_gpu_row,
    parse_query_gpu,
    read_gpus,
    read_nvml,
    smi_failure,
    stream_gpus,
)
from backends.hosts import CommandResult, LocalHost

TESTS = Path(__file__).resolve().parent.parent
FIXTURES = TESTS / "fixtures" / "h200"
FAKE_SMI = TESTS / "fake_nvidia_smi.py"
UUID = "GPU-00000000-1111-2222-3333-444444444444"
CAPTURED_FIELDS = (
    "index,name,uuid,power.draw,power.limit,power.max_limit,memory.used,memory.total,"
    "utilization.gpu,utilization.memory,temperature.gpu,clocks.sm,pstate"
).split(",")
STREAM_FIELDS = ("index", "power.draw", "memory.used", "utilization.gpu")
STREAM_POWER = [690.96, 689.83, 689.66, 689.85, 689.82, 690.23, 691.07, 691.49, 691.20, 691.78, 692.84, 691.34]


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def h200(power_w, mem_used_mib, util_pct, temp_c) -> GpuReading:
    return GpuReading(0, "NVIDIA H200", UUID, power_w, 700.0, mem_used_mib, 143771, util_pct, temp_c)


# ---------------------------------------------------------------------------------------
# The real formats


@pytest.mark.parametrize(
    "name, fields, expected",
    [
        ("query-gpu-idle.csv", QUERY_GPU_FIELDS, h200(77.98, 0, 0, 35)),
        ("query-gpu-load.csv", QUERY_GPU_FIELDS, h200(691.90, 25587, 99, 58)),
        ("query-gpu-idle-nounits.csv", CAPTURED_FIELDS, h200(77.99, 0, 0, 35)),
        ("query-gpu-load-nounits.csv", CAPTURED_FIELDS, h200(690.51, 25587, 99, 58)),
    ],
)
def test_query_gpu_captures(name, fields, expected):
    # With a header the header names the columns and `fields` is not consulted.
    assert parse_query_gpu(fixture(name), fields) == [expected]


def test_stream_capture_groups_into_one_sample_per_line():
    rows = parse_query_gpu(fixture("stream-lms250.csv"), STREAM_FIELDS)
    assert [r.power_w for r in rows] == STREAM_POWER
    assert {(r.index, r.mem_used_mib, r.util_pct, r.name) for r in rows} == {(0, 25587, 99, None)}
    grouper = SampleGrouper(0)
    assert [s for r in rows for s in grouper.push(r)] == [(r,) for r in rows]


@pytest.mark.parametrize("name", ["compute-apps-load.csv", "compute-apps-load-nounits.csv"])
def test_compute_apps_captures(name):
    assert parse_compute_apps(fixture(name), {UUID: 0}) == [GpuProcess(525, 0, 25578, "python3")]


def test_compute_apps_idle_capture_is_header_only():
    assert parse_compute_apps(fixture("compute-apps-idle.csv"), {UUID: 0}) == []


def test_missing_readings_are_none():
    row = f"3, NVIDIA H200, {UUID}, [N/A], [Not Supported], [Unknown Error], 143771 MiB, N/A, "
    assert parse_gpu_row(row) == GpuReading(3, "NVIDIA H200", UUID, None, None, None, 143771, None, None)
    assert parse_app_row(f"77, python3, [N/A], {UUID}", {UUID: 0}) == GpuProcess(77, 0, None, "python3")


class FakeNvml:
    """A fake of pynvml for this GPU-less machine, answering with the H200's NVML capture."""

    class NVMLError(Exception):
        pass

    NVML_TEMPERATURE_GPU = 0
    nvmlMemory_v2 = 0x2000028

    def __init__(self, capture: str):
        lines = capture.splitlines()  # name …, power_mW … limit_mW …, mem_used … total …, util …, proc PID BYTES
        self.name = lines[0].removeprefix("name ")
        words = " ".join(lines[1:4]).split()
        self.numbers = dict(zip(words[::2], words[1::2]))
        proc = lines[4].split()
        self.proc = SimpleNamespace(pid=int(proc[1]), usedGpuMemory=int(proc[2]))

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetName(self, handle):
        return self.name.encode()  # older pynvml returns bytes

    def nvmlDeviceGetUUID(self, handle):
        return UUID

    def nvmlDeviceGetPowerUsage(self, handle):
        return int(self.numbers["power_mW"])

    def nvmlDeviceGetEnforcedPowerLimit(self, handle):
        return int(self.numbers["limit_mW"])

    def nvmlDeviceGetMemoryInfo(self, handle, version=None):
        if version is not None:  # the capture is of the v1 call; a driver without v2 says so
            raise self.NVMLError("Function Not Found")
        return SimpleNamespace(used=int(self.numbers["mem_used"]), total=int(self.numbers["total"]))

    def nvmlDeviceGetUtilizationRates(self, handle):
        return SimpleNamespace(gpu=int(self.numbers["util"]))

    def nvmlDeviceGetTemperature(self, handle, sensor):
        raise self.NVMLError("Not Supported")

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return [self.proc]

    def nvmlSystemGetProcessName(self, pid):
        return b"python3"


def test_nvml_capture_converts_units():
    snapshot = read_nvml(FakeNvml(fixture("nvml-load.txt")))
    assert snapshot.status is GpuStatus.OK and snapshot.source == "nvml"
    # 27,474,657,280 B used (v1: includes the driver's reservation) = 26201.9 MiB, floored.
    assert snapshot.gpus == (GpuReading(0, "NVIDIA H200", UUID, 691.36, 700.0, 26201, 143771, 99, None),)
    # NVML's per-process bytes are exactly nvidia-smi's 25578 MiB for the same process.
    assert snapshot.processes == (GpuProcess(525, 0, 25578, "python3"),)
    assert snapshot.processes_of({525, 1}) == snapshot.processes
    assert snapshot.processes_of({1}) == ()
    assert snapshot.gpus[0].power_frac == pytest.approx(691.36 / 700)


@pytest.mark.parametrize(
    "result, status",
    [
        (CommandResult(6, "No devices were found\n", ""), GpuStatus.NO_GPU),
        (CommandResult(127, "", "bash: line 1: nvidia-smi: command not found\n"), GpuStatus.NO_SMI),
        (
            CommandResult(9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                          "Make sure that the latest NVIDIA driver is installed and running.\n", ""),
            GpuStatus.DRIVER_ERROR,
        ),
        (CommandResult(18, "Failed to initialize NVML: Driver/library version mismatch\n", ""), GpuStatus.DRIVER_ERROR),
        (CommandResult(255, "", "Segmentation fault\n"), GpuStatus.ERROR),
    ],
)
def test_failures_are_classified(result, status):
    found, message = smi_failure(result, "nvidia-smi")
    assert found is status
    assert message.strip()


def test_success_is_not_a_failure():
    assert smi_failure(CommandResult(0, fixture("query-gpu-idle-nounits.csv"), ""), "nvidia-smi") is None


# ---------------------------------------------------------------------------------------
# Properties

# The machine running CI is shared and slow: timing is not what these properties are about.
relaxed = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
GPU_NAMES = ["NVIDIA H200", "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-16GB", "NVIDIA GeForce RTX 4090"]
MISSING = st.sampled_from(["[N/A]", "[Not Supported]", "[Unknown Error]"])
UNITS = {"power.draw": " W", "power.limit": " W", "memory.used": " MiB", "memory.total": " MiB", "utilization.gpu": " %"}


@st.composite
def readings(draw):
    cents = st.none() | st.integers(0, 10**6)
    mib = st.none() | st.integers(0, 10**7)
    power, limit = draw(cents), draw(cents)
    return GpuReading(
        index=draw(st.integers(0, 63)),
        name=draw(st.none() | st.sampled_from(GPU_NAMES)),
        uuid=draw(st.none() | st.uuids().map(lambda u: f"GPU-{u}")),
        power_w=None if power is None else power / 100,
        power_limit_w=None if limit is None else limit / 100,
        mem_used_mib=draw(mib),
        mem_total_mib=draw(mib),
        util_pct=draw(st.none() | st.integers(0, 100)),
        temp_c=draw(st.none() | st.integers(-40, 120)),
    )


def render(reading: GpuReading, units: bool, missing: str) -> str:
    values = [getattr(reading, a) for a in ("index", "name", "uuid", "power_w", "power_limit_w",
                                            "mem_used_mib", "mem_total_mib", "util_pct", "temp_c")]
    cells = []
    for field, value in zip(QUERY_GPU_FIELDS, values):
        if value is None:
            cells.append(missing)
        else:
            text = f"{value:.2f}" if isinstance(value, float) else str(value)
            cells.append(text + (UNITS.get(field, "") if units else ""))
    return ", ".join(cells)


@relaxed
@given(st.lists(readings(), max_size=8), st.booleans(), MISSING)
def test_well_formed_rows_round_trip(rows, units, missing):
    text = "".join(render(r, units, missing) + "\n" for r in rows)
    assert parse_query_gpu(text) == rows


@relaxed
@given(
    st.lists(st.tuples(st.integers(1, 2**22), st.text(st.characters(blacklist_characters="\r\n\x1c\x1d\x1e\x85\u2028\u2029\x0b\x0c"), max_size=30),
                       st.none() | st.integers(0, 10**6), st.sampled_from([UUID, "GPU-unknown"])), max_size=8),
    st.booleans(),
)
def test_well_formed_app_rows_round_trip(apps, units):
    text = "pid, process_name, used_gpu_memory [MiB], gpu_uuid\n" + "".join(
        f"{pid}, {name}, {'[N/A]' if used is None else str(used) + (' MiB' if units else '')}, {uuid}\n"
        for pid, name, used, uuid in apps
    )
    expected = [GpuProcess(pid, 0 if uuid == UUID else None, used, name.strip()) for pid, name, used, uuid in apps]
    assert parse_compute_apps(text, {UUID: 0}) == expected


CSV_TOKENS = st.sampled_from(
    [",", ", ", " ", "[N/A]", "[Not Supported]", "[", "]", "W", " MiB", "%", "-", "+", ".", "e5",
     "nan", "inf", "0", "7", "99999999999999999999", "NVIDIA H200", UUID, "\n", "\r", "\x00", "é", "index", "pid"]
)
CSV_LIKE = st.lists(CSV_TOKENS, max_size=60).map("".join) | st.text(max_size=300)


@relaxed
@given(CSV_LIKE, st.integers(-5, 300))
def test_malformed_output_never_raises(text, returncode):
    for reading in parse_query_gpu(text):
        assert isinstance(reading.index, int)
    for fields in (CAPTURED_FIELDS, STREAM_FIELDS):
        parse_query_gpu(text, fields)
    for line in text.splitlines() or [text]:
        parse_gpu_row(line)
        parse_app_row(line, {UUID: 0})
    parse_compute_apps(text, {UUID: 0})
    smi_failure(CommandResult(returncode, text, text), "nvidia-smi")


@relaxed
@given(st.integers(1, 8), st.integers(1, 6))
def test_grouper_splits_a_stream_into_samples(gpu_count, samples):
    cycles = [tuple(GpuReading(i, power_w=float(s)) for i in range(gpu_count)) for s in range(samples)]
    rows = [row for cycle in cycles for row in cycle]

    def group(last_index):
        grouper = SampleGrouper(last_index)
        out = [sample for row in rows for sample in grouper.push(row)]
        flat = [row for sample in out for row in sample]
        assert flat == rows[: len(flat)]  # nothing lost, repeated or reordered
        return out

    assert group(gpu_count - 1) == cycles
    # Told of too few GPUs (one was added): right from the second sample on.
    assert group(0)[len(group(0)) - (samples - 1):] == cycles[1:]
    # Told of too many (one fell off the bus): the first sample ends when the second starts,
    # which teaches the right count.
    assert group(gpu_count + 3) == (cycles if samples > 1 else [])


# ---------------------------------------------------------------------------------------
# A real LocalHost running the fake nvidia-smi


@pytest.fixture
def smi_bin(tmp_path, monkeypatch):
    """A directory first on PATH; `install()` puts the fake there as `nvidia-smi`."""
    for key in list(os.environ):
        if key.startswith("FAKE_NVIDIA_SMI_"):
            monkeypatch.delenv(key)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # PATH is this directory alone, so only the fake answers to `nvidia-smi`, even on a
    # machine with a real one; the fake's `#!/usr/bin/env python3` finds this Python.
    (bin_dir / "python3").symlink_to(sys.executable)
    monkeypatch.setenv("PATH", str(bin_dir))

    def install():
        (bin_dir / "nvidia-smi").symlink_to(FAKE_SMI)

    return install


async def read(**env) -> gpu.GpuSnapshot:
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(f"FAKE_NVIDIA_SMI_{key}", str(value))
        return await read_gpus(LocalHost(), nvml=False)


async def test_read_idle(smi_bin):
    smi_bin()
    snapshot = await read()
    assert (snapshot.status, snapshot.source, snapshot.message) == (GpuStatus.OK, "nvidia-smi", "")
    assert snapshot.gpus == (h200(77.99, 0, 0, 35),)
    assert snapshot.processes == ()


async def test_read_eight_loaded_gpus(smi_bin):
    smi_bin()
    snapshot = await read(STATE="load", GPUS=8)
    assert snapshot.ok
    assert [g.index for g in snapshot.gpus] == list(range(8))
    assert len({g.uuid for g in snapshot.gpus}) == 8
    assert {(g.power_w, g.mem_used_mib, g.util_pct) for g in snapshot.gpus} == {(690.51, 25587, 99)}
    assert snapshot.processes == (GpuProcess(525, 0, 25578, "python3"),)


async def test_read_not_available_fields(smi_bin):
    smi_bin()
    snapshot = await read(NA="power.draw,temperature.gpu=[Not Supported],utilization.gpu=[Unknown Error]")
    assert snapshot.ok
    (reading,) = snapshot.gpus
    assert (reading.power_w, reading.temp_c, reading.util_pct, reading.power_frac) == (None, None, None, None)
    assert (reading.power_limit_w, reading.mem_total_mib) == (700.0, 143771)


@pytest.mark.parametrize(
    "env, status, words",
    [
        ({"FAIL": "no-devices"}, GpuStatus.NO_GPU, "no devices"),
        ({"FAIL": "driver"}, GpuStatus.DRIVER_ERROR, "couldn't communicate with the NVIDIA driver"),
        ({"FAIL": "garbage"}, GpuStatus.ERROR, "unreadable nvidia-smi output"),
    ],
)
async def test_read_failures_are_states(smi_bin, env, status, words):
    smi_bin()
    snapshot = await read(**env)
    assert snapshot.status is status
    assert words in snapshot.message
    assert snapshot.gpus == ()


async def test_read_without_nvidia_smi(smi_bin):
    snapshot = await read()
    assert snapshot.status is GpuStatus.NO_SMI
    assert "nvidia-smi" in snapshot.message


async def test_processes_release_memory_when_they_exit(smi_bin, tmp_path):
    """What kill verification sees: a process holds memory until it is gone, then not."""
    smi_bin()
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    procs = tmp_path / "procs.json"
    procs.write_text(json.dumps([{"pid": holder.pid, "gpu": 1, "used_mib": 40000, "name": "python3"}]))
    try:
        before = await read(GPUS=2, PROCS=procs)
        assert before.processes_of({holder.pid}) == (GpuProcess(holder.pid, 1, 40000, "python3"),)
        assert [g.mem_used_mib for g in before.gpus] == [0, 40000]
    finally:
        holder.kill()
        holder.wait()
    after = await read(GPUS=2, PROCS=procs)
    assert after.processes_of({holder.pid}) == ()
    assert [g.mem_used_mib for g in after.gpus] == [0, 0]


async def take(stream, n: int) -> list[gpu.GpuSnapshot]:
    async with contextlib.aclosing(stream) as snapshots:
        out = []
        async for snapshot in snapshots:
            out.append(snapshot)
            if len(out) == n:
                return out


async def test_stream_replays_the_lms_capture(smi_bin, monkeypatch):
    smi_bin()
    monkeypatch.setenv("FAKE_NVIDIA_SMI_STATE", "load")
    monkeypatch.setenv("FAKE_NVIDIA_SMI_GPUS", "2")
    first, *streamed = await asyncio.wait_for(take(stream_gpus(LocalHost(), 50, nvml=False), 6), 20)
    assert first.ok and first.processes == (GpuProcess(525, 0, 25578, "python3"),)
    for snapshot, power in zip(streamed, STREAM_POWER):
        assert snapshot.ok
        assert [(g.index, g.power_w, g.mem_used_mib) for g in snapshot.gpus] == [(0, power, 25587), (1, power, 25587)]
    times = [s.time for s in streamed]
    assert times == sorted(times)


async def test_stream_reopens_after_nvidia_smi_exits(smi_bin, monkeypatch):
    smi_bin()
    monkeypatch.setenv("FAKE_NVIDIA_SMI_STATE", "load")
    monkeypatch.setenv("FAKE_NVIDIA_SMI_LOOPS", "2")
    snapshots = await asyncio.wait_for(take(stream_gpus(LocalHost(), 20, nvml=False), 7), 20)
    assert all(s.ok for s in snapshots)
    # Each round: a one-shot read (with the process rows), then a channel that gives two
    # samples (GPU rows only) and exits.
    assert [bool(s.processes) for s in snapshots] == [True, False, False] * 2 + [True]


@pytest.mark.parametrize(
    "env, status",
    [
        ({"FAKE_NVIDIA_SMI_FAIL": "no-devices"}, GpuStatus.NO_GPU),
        ({"FAKE_NVIDIA_SMI_FAIL": "driver"}, GpuStatus.DRIVER_ERROR),
        ({"FAKE_NVIDIA_SMI_FAIL": "garbage"}, GpuStatus.ERROR),
        (None, GpuStatus.NO_SMI),
    ],
)
async def test_stream_failures_are_states_and_recover(smi_bin, monkeypatch, env, status):
    monkeypatch.setattr(gpu.stream, "STREAM_RETRY_S", 0.05)
    monkeypatch.setattr(gpu.stream, "STREAM_RETRY_CAP_S", 0.05)
    if env is not None:  # else nothing is installed: no nvidia-smi on PATH
        smi_bin()
        for key, value in env.items():
            monkeypatch.setenv(key, value)
    async with contextlib.aclosing(stream_gpus(LocalHost(), 50, nvml=False)) as stream:
        first = await asyncio.wait_for(anext(stream), 20)
        assert first.status is status and first.message and first.gpus == ()
        # The trouble goes away (driver back, binary installed): the stream recovers by itself.
        if env is None:
            smi_bin()
        else:
            for key in env:
                monkeypatch.delenv(key)
        async def first_ok():
            async for snapshot in stream:
                if snapshot.ok:
                    return snapshot
        recovered = await asyncio.wait_for(first_ok(), 20)
        assert recovered.gpus == (h200(77.99, 0, 0, 35),)


async def test_stream_of_not_available_fields(smi_bin, monkeypatch):
    smi_bin()
    monkeypatch.setenv("FAKE_NVIDIA_SMI_NA", "power.draw,memory.used=[Unknown Error]")
    snapshots = await asyncio.wait_for(take(stream_gpus(LocalHost(), 20, nvml=False), 3), 20)
    assert all(s.ok for s in snapshots)
    assert {(g.power_w, g.mem_used_mib, g.mem_total_mib) for s in snapshots for g in s.gpus} == {(None, None, 143771)}


# ---------------------------------------------------------------------------------------
# On a real GPU (the coordinator runs these on the H200)


def show(label: str, snapshot: gpu.GpuSnapshot) -> None:
    print(f"{label}: {snapshot.status.value} via {snapshot.source} {snapshot.message}")
    for g in snapshot.gpus:
        print(f"  {g}")
    for p in snapshot.processes:
        print(f"  {p}")


async def read_both() -> tuple[gpu.GpuSnapshot, gpu.GpuSnapshot]:
    host = LocalHost()
    nvml, smi = await asyncio.gather(read_gpus(host), read_gpus(host, nvml=False))
    show("NVML", nvml)
    show("nvidia-smi", smi)
    assert nvml.ok and nvml.source == "nvml", nvml.message
    assert smi.ok and smi.source == "nvidia-smi", smi.message
    assert len(nvml.gpus) == len(smi.gpus)
    for a, b in zip(nvml.gpus, smi.gpus):
        assert (a.index, a.uuid, a.name) == (b.index, b.uuid, b.name)
        assert a.power_limit_w == pytest.approx(b.power_limit_w, abs=0.01)
        assert a.power_w == pytest.approx(b.power_w, rel=0.05, abs=3.0)
        assert a.mem_total_mib == b.mem_total_mib
        assert abs(a.mem_used_mib - b.mem_used_mib) <= 8
        assert abs(a.temp_c - b.temp_c) <= 2
    return nvml, smi


@pytest.mark.gpu
async def test_nvml_and_nvidia_smi_agree():
    await read_both()


@pytest.mark.gpu
async def test_a_configured_nvidia_smi_is_read_even_where_nvml_works():
    snapshot = await read_gpus(LocalHost(), str(FAKE_SMI))
    assert snapshot.ok and snapshot.source == "nvidia-smi", snapshot.message
    assert (await read_gpus(LocalHost())).source == "nvml"


LOAD = """
import sys, torch
x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
hold = torch.empty(4 << 30, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print("ready", flush=True)
while True:
    x = (x @ x).clamp_(-1, 1)
"""


@pytest.mark.gpu
async def test_nvml_and_nvidia_smi_agree_under_load():
    """Also the per-process figures kill verification relies on, and how soon they clear."""
    load = subprocess.Popen([sys.executable, "-c", LOAD], stdout=subprocess.PIPE, text=True)
    try:
        assert load.stdout.readline().strip() == "ready"
        await asyncio.sleep(2)  # let the power reading settle under the matmuls
        nvml, smi = await read_both()
        (a,) = nvml.processes_of({load.pid})
        (b,) = smi.processes_of({load.pid})
        assert (a.gpu_index, a.used_mib) == (b.gpu_index, b.used_mib)
        assert a.used_mib >= 4096
    finally:
        load.kill()
        load.wait()
    killed = time.monotonic()
    for source in ("nvml", "nvidia-smi"):
        while (await read_gpus(LocalHost(), nvml=source == "nvml")).processes_of({load.pid}):
            assert time.monotonic() - killed < 10, f"{source} still lists the killed process"
            await asyncio.sleep(0.02)
        print(f"{source}: released {time.monotonic() - killed:.3f} s after the process exited")
