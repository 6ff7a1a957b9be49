"""GPUs read in-process through NVML (pynvml, imported lazily): a local host's fast path,
with no subprocess per sample."""

from __future__ import annotations

import asyncio

from backends.gpu.snapshot import GpuProcess, GpuReading, GpuSnapshot, GpuStatus

MIB = 1 << 20

_nvml_lib = None  # the pynvml module once nvmlInit succeeded; False once it failed


def library():
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


async def read_in_process() -> GpuSnapshot | None:
    """A snapshot from NVML in this process, or None when NVML cannot be used."""
    nv = library()
    if nv is None:
        return None
    try:
        return await asyncio.to_thread(read_nvml, nv)
    except nv.NVMLError:
        return None  # let nvidia-smi say what is wrong, in its words
