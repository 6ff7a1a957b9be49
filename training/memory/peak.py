"""A step's predicted peak, what the caching allocator holds at it, and whether it fits a
card: what either drafter's memory model predicts (training/drafters/*/memory)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from training.memory.units import GiB

# What the caching allocator holds beyond the allocated peak, with the trainer's expandable
# segments (device.use_cuda_allocator_settings): recorded H200 steps of 8K-32K tokens held
# 0.8-1.9 % more reserved than allocated (without them, 6.3-9.1 %). A probe's small steps
# give their slack as an absolute amount (Calibration.reserved_slack), not as a ratio to
# extrapolate to the large steps that decide a fit.
RESERVED_RATIO = 1.02
# Outside the allocator: CUDA context, cuBLAS/NCCL handles; a card's memory minus this is
# what the allocator may use.
DEFAULT_HEADROOM_GIB = 1.0


@dataclass(frozen=True)
class Prediction:
    terms: dict[str, dict[str, int]]  # the peak phase's group → term → bytes, scaled
    phase: str  # the forward+backward phase that peaks
    forward_backward: int
    optimizer_step: int
    reserved_slack: int  # the probe's measured slack
    row_slack: int  # the cached whole-row blocks of long rows

    @property
    def total(self) -> int:
        """Predicted peak of torch.cuda.max_memory_allocated over the step."""
        return max(self.forward_backward, self.optimizer_step)

    @property
    def reserved(self) -> int:
        """What the caching allocator holds at the peak: what a memory cap is checked against."""
        return max(math.ceil(self.total * RESERVED_RATIO),
                   self.total + max(self.reserved_slack, self.row_slack))

    def breakdown(self) -> dict[str, int]:
        flat = {name: v for group in self.terms.values() for name, v in group.items()}
        flat["allocator_slack"] = self.reserved - self.total
        return flat


def fits(prediction: Prediction, gpu_mem_gib: float,
         headroom_gib: float = DEFAULT_HEADROOM_GIB) -> bool:
    return prediction.reserved <= (gpu_mem_gib - headroom_gib) * GiB
