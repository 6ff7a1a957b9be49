"""GPU telemetry: per-GPU power, limit, memory, utilisation, temperature, and per-process memory.

A local host reads NVML in-process (`nvml`); any other host, or a local one whose NVML does
not work, is read through `nvidia-smi --query-gpu … --format=csv` over `Host.run` (`smi`),
and streamed over one long-lived `nvidia-smi … -lms N` channel (`stream`). What a reading
is, and how trouble reads as a status rather than an exception, is in `snapshot`; `read`
picks the source for one read. Callers import from here.
"""

from backends.gpu.nvml import read_nvml
from backends.gpu.read import read_gpus
from backends.gpu.smi import (
    DEFAULT_SMI,
    QUERY_GPU_FIELDS,
    parse_app_row,
    parse_compute_apps,
    parse_gpu_row,
    parse_query_gpu,
    read_processes,
    smi_failure,
)
from backends.gpu.snapshot import GpuProcess, GpuReading, GpuSnapshot, GpuStatus
from backends.gpu.stream import SampleGrouper, stream_gpus

__all__ = [
    "DEFAULT_SMI",
    "QUERY_GPU_FIELDS",
    "GpuProcess",
    "GpuReading",
    "GpuSnapshot",
    "GpuStatus",
    "SampleGrouper",
    "parse_app_row",
    "parse_compute_apps",
    "parse_gpu_row",
    "parse_query_gpu",
    "read_gpus",
    "read_nvml",
    "read_processes",
    "smi_failure",
    "stream_gpus",
]
