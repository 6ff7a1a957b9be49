"""GPUs read through `nvidia-smi --query-gpu … --format=csv` (and `--query-compute-apps`)
over `Host.run`: any host but this one, or this one when NVML does not work here or the
host is configured with its own command.

The parsers take the CSV with or without header and units; a field nvidia-smi has no
reading for is None, and what nvidia-smi says when it cannot list GPUs becomes a status.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Mapping, Sequence

from backends.gpu.snapshot import GpuProcess, GpuReading, GpuSnapshot, GpuStatus
from backends.hosts import CommandResult, Host, HostError

# The command GPUs are read with unless a host is configured otherwise; a configured one
# is run even where NVML would answer (read_gpus).
DEFAULT_SMI = "nvidia-smi"

# The fields read_smi and the stream ask nvidia-smi for, in the column order it prints them.
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


_INT = re.compile(r"[-+]?\d+")
_FLOAT = re.compile(r"[-+]?\d+(?:\.\d+)?")
# Units nvidia-smi appends without `nounits` ("77.98 W", "0 MiB", "99 %", "345 MHz").
# Cut by string methods, not an end-anchored pattern: `\s*…$` is tried from every
# position of a line, quadratic on a long one.
_UNITS = ("MiB", "MHz", "W", "%", "C")


def _without_unit(text: str) -> str:
    for unit in _UNITS:
        if text.endswith(unit):
            return text.removesuffix(unit).rstrip()
    return text


def _without_header_unit(cell: str) -> str:
    """`power.draw [W]` → `power.draw`."""
    if cell.endswith("]") and "[" in cell:
        return cell[: cell.rindex("[")].rstrip()
    return cell


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
    text = _without_unit(text)
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
    cells = [_without_header_unit(c.strip()) for c in line.split(",")]
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


def smi_argv(smi: str, *extra: str) -> list[str]:
    return [smi, f"--query-gpu={','.join(QUERY_GPU_FIELDS)}", CSV_FORMAT, *extra]


def _apps_argv(smi: str) -> list[str]:
    return [smi, f"--query-compute-apps={','.join(QUERY_APPS_FIELDS)}", CSV_FORMAT]


def _processes(result: CommandResult, gpus: Sequence[GpuReading]) -> tuple[tuple[GpuProcess, ...], str]:
    """The processes a `--query-compute-apps` run listed, and why there are none if it failed."""
    if not result.ok:
        return (), f"per-process memory unavailable: {(result.stderr or result.stdout).strip()[:200]}"
    return tuple(parse_compute_apps(result.stdout, {g.uuid: g.index for g in gpus if g.uuid})), ""


async def read_smi(host: Host, smi: str) -> GpuSnapshot:
    try:
        gpus_result, apps_result = await asyncio.gather(
            host.run(smi_argv(smi), timeout=SMI_TIMEOUT_S),
            host.run(_apps_argv(smi), timeout=SMI_TIMEOUT_S),
        )
    except HostError as e:
        return GpuSnapshot(GpuStatus.ERROR, e.reason, source="nvidia-smi")  # its host is said by whoever shows it
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
