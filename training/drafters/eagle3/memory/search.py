"""The largest step that fits a card: the longest rows, or the fewest TTT steps to recompute."""
from __future__ import annotations

import dataclasses

from training.config import DrafterConfig
from training.drafters.eagle3.memory.calibrate import Calibration
from training.drafters.eagle3.memory.peak import predict
from training.drafters.eagle3.memory.terms import StepShape
from training.memory.peak import DEFAULT_HEADROOM_GIB, fits


def fewest_checkpoint_ttt(cfg: DrafterConfig, shape: StepShape, gpu_mem_gib: float, *,
                          calibration: Calibration | None = None,
                          headroom_gib: float = DEFAULT_HEADROOM_GIB) -> int | None:
    """The fewest TTT steps recomputed (at least the shape's own) with which the step fits
    the card, or None if it does not fit even with every step recomputed."""
    return next((n for n in range(min(shape.checkpoint_ttt, shape.ttt_steps),
                                  shape.ttt_steps + 1)
                 if fits(predict(cfg, dataclasses.replace(shape, checkpoint_ttt=n),
                                 calibration), gpu_mem_gib, headroom_gib)), None)


def largest_fitting(cfg: DrafterConfig, ttt_steps: int, gpu_mem_gib: float, *,
                    shape: StepShape | None = None, multiple: int = 1024,
                    calibration: Calibration | None = None,
                    headroom_gib: float = DEFAULT_HEADROOM_GIB) -> int:
    """The largest max_seq_len, a multiple of `multiple`, whose predicted peak fits at
    `ttt_steps` in steps otherwise shaped as `shape` (batch rows, precision, ...); 0 if none.

    The prediction grows monotonically with max_seq_len: doubling finds a bound, bisection
    the answer.
    """
    if multiple <= 0:
        raise ValueError(f"multiple must be positive, got {multiple}")
    if gpu_mem_gib <= 0:
        raise ValueError(f"gpu_mem_gib must be positive, got {gpu_mem_gib}")

    base = shape or StepShape(1, 1)

    def fits_at(k: int) -> bool:
        at = dataclasses.replace(base, max_seq_len=k * multiple, ttt_steps=ttt_steps)
        return fits(predict(cfg, at, calibration), gpu_mem_gib, headroom_gib)

    if not fits_at(1):
        return 0
    lo, hi = 1, 2  # fits_at(lo) holds; find hi that does not
    while fits_at(hi):
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits_at(mid) else (lo, mid)
    return lo * multiple
