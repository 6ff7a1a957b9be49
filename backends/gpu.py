"""GPU telemetry: per-GPU power, limit, memory, utilisation, temperature, and per-process memory.

A local host reads NVML in-process (pynvml, imported lazily); any other host, or a local one
whose NVML does not work, is read through `nvidia-smi --query-gpu … --format=csv` over
`Host.run`, and streamed over one long-lived `nvidia-smi … -lms N` channel.

Trouble with the GPU is a value, never an exception: "No devices were found", a missing
nvidia-smi, a driver that does not answer, garbage output and an unreachable host each give a
`GpuSnapshot` whose `status` says which and whose `message` says what happened. A field the
card cannot report (`[N/A]`, `[Not Supported]`, `[Unknown Error]`) is None.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import re
import time
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from backends.hosts import CommandResult, Host, HostError

MIB = 1 << 20

# The command GPUs are read with unless a host is configured otherwise; a configured one
# is run even where NVML would answer (read_gpus).
DEFAULT_SMI = "nvidia-smi"

# The fields read_gpus and stream_gpus ask nvidia-smi for, in the column order it prints them.
QUERY_GPU_FIELDS = (
    "index",
    "name",
    "uuid",
    "power.draw",
    "power.limit",
    "memory.used",
    "memory.total",
    "utilization.gpu",
    "temperature.gpu",
)
QUERY_APPS_FIELDS = ("pid", "process_name", "used_memory", "gpu_uuid")
CSV_FORMAT = "--format=csv,noheader,nounits"

# nvidia-smi can hang for tens of seconds when the driver is wedged; that is a state too.
SMI_TIMEOUT_S = 15.0
# Delay before reopening a failed stream: doubles from the first to the last while it keeps failing.
RETRY_DELAYS_S = (1.0, 2.0, 5.0, 10.0, 30.0)


class GpuStatus(enum.Enum):
    OK = "ok"
    NO_GPU = "no_gpu"  # the driver answers but lists no device
    NO_SMI = "no_smi"  # nvidia-smi is not installed (or not on PATH) on the host
    DRIVER_ERROR = "driver_error"  # nvidia-smi cannot talk to the driver
    ERROR = "error"  # anything else: garbage output, timeouts, an unreachable host


@dataclass(frozen=True)
class GpuReading:
    index: int
    name: str | None = None
    uuid: str | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    mem_used_mib: int | None = None
    mem_total_mib: int | None = None
    util_pct: int | None = None
    temp_c: int | None = None

    @property
    def power_frac(self) -> float | None:
        """Power draw as a fraction of the enforced limit: the honest utilisation signal."""
        if self.power_w is None or not self.power_limit_w:
            return None
        return self.power_w / self.power_limit_w


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    gpu_index: int | None  # None when the process's GPU UUID matches no listed GPU
    used_mib: int | None
    name: str = ""


@dataclass(frozen=True)
class GpuSnapshot:
    status: GpuStatus
    message: str = ""
    gpus: tuple[GpuReading, ...] = ()
    processes: tuple[GpuProcess, ...] = ()
    time: float = field(default_factory=time.time)
    source: str = ""  # "nvml" or "nvidia-smi": where the figures came from
    streamed: bool = False  # a `-lms` sample: GPU rows only, its processes were not read

    @property
    def ok(self) -> bool:
        return self.status is GpuStatus.OK

    def processes_of(self, pids: Collection[int]) -> tuple[GpuProcess, ...]:
        """The compute processes among `pids` (those that still hold GPU memory)."""
        return tuple(p for p in self.processes if p.pid in pids)


# ---------------------------------------------------------------------------------------
# nvidia-smi CSV

_INT = re.compile(r"[-+]?\d+")
_FLOAT = re.compile(r"[-+]?\d+(?:\.\d+)?")
# Units nvidia-smi appends without `nounits` ("77.98 W", "0 MiB", "99 %", "345 MHz").
_UNIT = re.compile(r"\s*(?:W|MiB|%|MHz|C)$")
_HEADER_UNIT = re.compile(r"\s*\[[^\]]*\]$")


def _value(raw: str) -> str | None:
    """A field's text, or None for what nvidia-smi prints when it has no reading."""
    text = raw.strip()
    if not text or text == "N/A" or (text.startswith("[") and text.endswith("]")):
        return None
    return text


def _number(raw: str, pattern: re.Pattern[str], kind: Callable[[str], int | float]):
    text = _value(raw)
    if text is None:
        return None
    text = _UNIT.sub("", text)
    return kind(text) if pattern.fullmatch(text) else None


def parse_int(raw: str) -> int | None:
    return _number(raw, _INT, int)


def parse_float(raw: str) -> float | None:
    return _number(raw, _FLOAT, float)


# CSV field name → (GpuReading attribute, parser)
_GPU_COLUMNS: dict[str, tuple[str, Callable[[str], object]]] = {
    "index": ("index", parse_int),
    "name": ("name", _value),
    "uuid": ("uuid", _value),
    "power.draw": ("power_w", parse_float),
    "power.limit": ("power_limit_w", parse_float),
    "memory.used": ("mem_used_mib", parse_int),
    "memory.total": ("mem_total_mib", parse_int),
    "utilization.gpu": ("util_pct", parse_int),
    "temperature.gpu": ("temp_c", parse_int),
}


def _header_fields(line: str, first: str) -> list[str] | None:
    """The field names of a `--format=csv` header line (units dropped), else None."""
    cells = [_HEADER_UNIT.sub("", c.strip()) for c in line.split(",")]
    return cells if cells[0] == first else None


def parse_gpu_row(line: str, fields: Sequence[str] = QUERY_GPU_FIELDS) -> GpuReading | None:
    """One `--query-gpu` CSV row (with or without units) → GpuReading; None if malformed."""
    cells = line.split(",")
    if len(cells) != len(fields):
        return None
    values = {}
    for name, cell in zip(fields, cells):
        if name in _GPU_COLUMNS:
            attr, parse = _GPU_COLUMNS[name]
            values[attr] = parse(cell)
    if not isinstance(values.get("index"), int):
        return None
    return GpuReading(**values)


def parse_query_gpu(text: str, fields: Sequence[str] = QUERY_GPU_FIELDS) -> list[GpuReading]:
    """`nvidia-smi --query-gpu=FIELDS --format=csv[,noheader][,nounits]` output → readings.

    A header line, when present, names the columns (so any field list parses); unreadable
    lines are skipped.
    """
    rows = []
    for line in text.splitlines():
        header = _header_fields(line, "index")
        if header is not None:
            fields = header
        elif (reading := parse_gpu_row(line, fields)) is not None:
            rows.append(reading)
    return rows


def parse_app_row(line: str, gpu_index: Mapping[str, int]) -> GpuProcess | None:
    """One `--query-compute-apps=pid,process_name,used_memory,gpu_uuid` row; None if malformed.

    `gpu_index` maps GPU UUIDs to indices. The process name may itself contain commas.
    """
    head, sep, rest = line.partition(",")
    parts = rest.rsplit(",", 2) if sep else []
    if len(parts) != 3:
        return None
    pid = parse_int(head)
    if pid is None or pid <= 0:
        return None
    name, used, uuid = parts
    return GpuProcess(pid, gpu_index.get(uuid.strip()), parse_int(used), name.strip())


def parse_compute_apps(text: str, gpu_index: Mapping[str, int]) -> list[GpuProcess]:
    """`nvidia-smi --query-compute-apps=pid,process_name,used_memory,gpu_uuid` output."""
    return [
        proc
        for line in text.splitlines()
        if _header_fields(line, "pid") is None and (proc := parse_app_row(line, gpu_index))
    ]


def smi_failure(result: CommandResult, smi: str) -> tuple[GpuStatus, str] | None:
    """The state an nvidia-smi run reports when it did not list GPUs, or None if it did."""
    output = f"{result.stdout}\n{result.stderr}"
    first_line = next((ln.strip() for ln in output.splitlines() if ln.strip()), "")
    if result.returncode in (126, 127) or "command not found" in output:
        return GpuStatus.NO_SMI, f"no nvidia-smi: {first_line or smi + ' not found'}"
    if "No devices were found" in output:
        return GpuStatus.NO_GPU, "no GPU: nvidia-smi found no devices"
    if (
        "NVIDIA-SMI has failed" in output
        or "communicate with the NVIDIA driver" in output
        or "version mismatch" in output
    ):
        return GpuStatus.DRIVER_ERROR, f"driver error: {first_line}"
    if result.returncode != 0:
        return GpuStatus.ERROR, f"{smi} exited with status {result.returncode}: {first_line}"
    return None


# ---------------------------------------------------------------------------------------
# Reading once


def _smi_argv(smi: str, *extra: str) -> list[str]:
    return [smi, f"--query-gpu={','.join(QUERY_GPU_FIELDS)}", CSV_FORMAT, *extra]


def _apps_argv(smi: str) -> list[str]:
    return [smi, f"--query-compute-apps={','.join(QUERY_APPS_FIELDS)}", CSV_FORMAT]


def _processes(result: CommandResult, gpus: Sequence[GpuReading]) -> tuple[tuple[GpuProcess, ...], str]:
    """The processes a `--query-compute-apps` run listed, and why there are none if it failed."""
    if not result.ok:
        return (), f"per-process memory unavailable: {(result.stderr or result.stdout).strip()[:200]}"
    return tuple(parse_compute_apps(result.stdout, {g.uuid: g.index for g in gpus if g.uuid})), ""


async def _read_smi(host: Host, smi: str) -> GpuSnapshot:
    try:
        gpus_result, apps_result = await asyncio.gather(
            host.run(_smi_argv(smi), timeout=SMI_TIMEOUT_S),
            host.run(_apps_argv(smi), timeout=SMI_TIMEOUT_S),
        )
    except HostError as e:
        return GpuSnapshot(GpuStatus.ERROR, str(e), source="nvidia-smi")
    if (failure := smi_failure(gpus_result, smi)) is not None:
        return GpuSnapshot(*failure, source="nvidia-smi")
    gpus = parse_query_gpu(gpus_result.stdout)
    if not gpus:
        text = gpus_result.stdout.strip()
        if not text:
            return GpuSnapshot(GpuStatus.NO_GPU, "no GPU: nvidia-smi listed none", source="nvidia-smi")
        return GpuSnapshot(GpuStatus.ERROR, f"unreadable nvidia-smi output: {text[:200]!r}", source="nvidia-smi")
    processes, message = _processes(apps_result, gpus)
    return GpuSnapshot(GpuStatus.OK, message, tuple(gpus), processes, source="nvidia-smi")


async def read_processes(
    host: Host, gpus: Sequence[GpuReading], smi: str = DEFAULT_SMI
) -> tuple[tuple[GpuProcess, ...], str]:
    """The compute processes on `gpus` (as a snapshot lists them), read now with one
    `--query-compute-apps`, for a stream's samples, which carry none: (processes, message),
    the message saying why there are none when nvidia-smi could not list them.

    Raises HostError when the host cannot be reached or the command times out.
    """
    return _processes(await host.run(_apps_argv(smi), timeout=SMI_TIMEOUT_S), gpus)


_nvml_lib = None  # the pynvml module once nvmlInit succeeded; False once it failed


def _nvml():
    """pynvml, initialised once per process, or None where NVML does not work here."""
    global _nvml_lib
    if _nvml_lib is None:
        try:
            import pynvml

            pynvml.nvmlInit()
            _nvml_lib = pynvml
        except Exception:  # ImportError, NVMLError_LibraryNotFound, NVMLError_DriverNotLoaded, …
            _nvml_lib = False
    return _nvml_lib or None


def _text(value) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def read_nvml(nv) -> GpuSnapshot:
    """Every GPU and compute process as the initialised pynvml module `nv` reports them (blocking)."""
    def get(fn, *args):
        try:
            return fn(*args)
        except nv.NVMLError:
            return None

    def memory(handle):
        # v2 reports used memory without the driver's reservation, as nvidia-smi does.
        try:
            return nv.nvmlDeviceGetMemoryInfo(handle, version=nv.nvmlMemory_v2)
        except (nv.NVMLError, AttributeError):
            return get(nv.nvmlDeviceGetMemoryInfo, handle)

    def scaled(value, divisor):
        return None if value is None else value / divisor

    gpus, processes = [], []
    for index in range(nv.nvmlDeviceGetCount()):
        handle = nv.nvmlDeviceGetHandleByIndex(index)
        mem = memory(handle)
        util = get(nv.nvmlDeviceGetUtilizationRates, handle)
        name, uuid = get(nv.nvmlDeviceGetName, handle), get(nv.nvmlDeviceGetUUID, handle)
        gpus.append(
            GpuReading(
                index=index,
                name=None if name is None else _text(name),
                uuid=None if uuid is None else _text(uuid),
                power_w=scaled(get(nv.nvmlDeviceGetPowerUsage, handle), 1000),
                power_limit_w=scaled(get(nv.nvmlDeviceGetEnforcedPowerLimit, handle), 1000),
                mem_used_mib=None if mem is None else mem.used // MIB,
                mem_total_mib=None if mem is None else mem.total // MIB,
                util_pct=None if util is None else util.gpu,
                temp_c=get(nv.nvmlDeviceGetTemperature, handle, nv.NVML_TEMPERATURE_GPU),
            )
        )
        for proc in get(nv.nvmlDeviceGetComputeRunningProcesses, handle) or ():
            used = proc.usedGpuMemory
            name = get(nv.nvmlSystemGetProcessName, proc.pid)
            processes.append(
                GpuProcess(proc.pid, index, None if used is None else used // MIB, "" if name is None else _text(name))
            )
    if not gpus:
        return GpuSnapshot(GpuStatus.NO_GPU, "no GPU: NVML lists no devices", source="nvml")
    return GpuSnapshot(GpuStatus.OK, "", tuple(gpus), tuple(processes), source="nvml")


async def _read_nvml() -> GpuSnapshot | None:
    """A snapshot from NVML in this process, or None when NVML cannot be used."""
    nv = _nvml()
    if nv is None:
        return None
    try:
        return await asyncio.to_thread(read_nvml, nv)
    except nv.NVMLError:
        return None  # let nvidia-smi say what is wrong, in its words


async def read_gpus(host: Host, smi: str = DEFAULT_SMI, *, nvml: bool = True) -> GpuSnapshot:
    """Every GPU of `host` and the compute processes holding memory on them, read now.

    NVML when the host is this machine, NVML works and `smi` is the plain `nvidia-smi`
    (unless `nvml=False`), else `smi`: a configured command (one run inside a container,
    a wrapper) is the operator's choice of what to read.
    """
    if nvml and host.is_local and smi == DEFAULT_SMI and (snapshot := await _read_nvml()) is not None:
        return snapshot
    return await _read_smi(host, smi)


# ---------------------------------------------------------------------------------------
# Streaming


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
    lines = host.lines(_smi_argv(smi, "-lms", str(interval_ms)))
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
    failures = 0
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
        failures = 0 if streamed else failures + 1
        await asyncio.sleep(RETRY_DELAYS_S[min(failures, len(RETRY_DELAYS_S)) - 1] if failures else interval_ms / 1000)
