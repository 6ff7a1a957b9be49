"""This process's device as a step uses it: the CUDA allocator's settings, the precision a
step runs at (bf16 autocast on CUDA, fp32 on the CPU), how a step's host tensors reach it,
and the peak memory it reports."""
from __future__ import annotations

import os
import resource

import torch


def use_cuda_allocator_settings() -> None:
    """Expandable segments: the caching allocator grows a segment in place instead of
    keeping a block per request size: the same speed, less memory held beyond the peak
    (docs/benchmarks.md, "Expandable segments"). CUDA reads the setting when it starts,
    so the trainer, `fit --probe` and the bench call this first; a PYTORCH_CUDA_ALLOC_CONF
    the user set wins."""
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")


def use_cpu_threads() -> None:
    """Half this process's cores (at least one) for a CPU run's intra-op threads, unless
    OMP_NUM_THREADS says otherwise. A CPU run shares its machine (with the dashboard that
    watches the demo, with tests): at a thread per core, each of a step's many parallel
    regions waits at OpenMP's barrier for the thread the scheduler put behind another
    process, which a small step pays on every op (docs/benchmarks.md, "CPU threads")."""
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // 2))


def precision(device: torch.device) -> str:
    """bf16 autocast on CUDA (as forward_backward runs it), fp32 on CPU."""
    return "bf16" if device.type == "cuda" else "fp32"


def autocast(device: torch.device) -> torch.autocast:
    """The autocast a drafter's forward runs under on `device`, at its precision."""
    return torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision(device) == "bf16")


def peak_mem_gib(device: torch.device) -> float:
    """CUDA: torch's peak allocated bytes. CPU: the process's peak resident set (RSS)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def onto(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """t on device. A host tensor goes through pinned memory: its copy is queued behind
    the device's work, where a copy from pageable memory would first wait for that work
    to finish."""
    if t.device == device:
        return t
    if device.type == "cuda":  # contiguous: a strided copy would stage through pageable memory
        t = t.contiguous().pin_memory()
    return t.to(device, non_blocking=True)
