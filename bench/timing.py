"""The median time of a call: CUDA events on a GPU (the kernels' time, not the launch's),
the wall clock on the CPU."""
from __future__ import annotations

import statistics
import time

import torch


def median_seconds(fn, reps: int, device: torch.device, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)
