"""Reading a host's GPUs once: NVML in this process where it answers, else nvidia-smi."""

from __future__ import annotations

from backends.gpu.nvml import read_in_process
from backends.gpu.smi import DEFAULT_SMI, read_smi
from backends.gpu.snapshot import GpuSnapshot
from backends.hosts import Host


async def read_gpus(host: Host, smi: str = DEFAULT_SMI, *, nvml: bool = True) -> GpuSnapshot:
    """Every GPU of `host` and the compute processes holding memory on them, read now.

    NVML when the host is this machine, NVML works and `smi` is the plain `nvidia-smi`
    (unless `nvml=False`), else `smi`: a configured command (one run inside a container,
    a wrapper) is the operator's choice of what to read.
    """
    if nvml and host.is_local and smi == DEFAULT_SMI and (snapshot := await read_in_process()) is not None:
        return snapshot
    return await read_smi(host, smi)
