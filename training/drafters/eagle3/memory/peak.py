"""EAGLE-3's predicted peak: the phase that peaks, its terms scaled by the calibration."""
from __future__ import annotations

from training.config import DrafterConfig
from training.drafters.eagle3.memory.calibrate import Calibration
from training.drafters.eagle3.memory.terms import (GROUPS, StepShape, analytic_phases,
                                                   optimizer_phase)
from training.memory.peak import Prediction
from training.memory.units import FP32

# Long rows hold more: whole-row fp32 tensors [T, H] (the final norm's backward gradients)
# cached between uses, beyond the allocated peak; the count is the most that recorded H200
# steps held (docs/benchmarks.md, the reserve refit and the memory model's tests).
CACHED_ROW_BLOCKS = 4

def predict(cfg: DrafterConfig, shape: StepShape,
            calibration: Calibration | None = None) -> Prediction:
    scales = calibration.scales if calibration else dict.fromkeys(GROUPS, 1.0)
    phases = {name: {g: {k: round(v * scales[g]) for k, v in group.items()}
                     for g, group in terms.items()}
              for name, terms in analytic_phases(cfg, shape).items()}
    totals = {name: sum(v for group in terms.values() for v in group.values())
              for name, terms in phases.items()}
    peak = max(totals, key=totals.get)
    return Prediction(phases[peak], peak, totals[peak], optimizer_phase(cfg, shape),
                      calibration.reserved_slack if calibration else 0,
                      CACHED_ROW_BLOCKS * shape.tokens * cfg.hidden_size * FP32)
