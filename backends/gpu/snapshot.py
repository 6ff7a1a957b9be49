"""What a GPU reading is: per-GPU figures, the processes holding memory, and a snapshot
that says whether the read worked.

Trouble with the GPU is a value, never an exception: "No devices were found", a missing
nvidia-smi, a driver that does not answer, garbage output and an unreachable host each give a
`GpuSnapshot` whose `status` says which and whose `message` says what happened. A field the
card cannot report (`[N/A]`, `[Not Supported]`, `[Unknown Error]`) is None.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Collection
from dataclasses import dataclass, field


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
