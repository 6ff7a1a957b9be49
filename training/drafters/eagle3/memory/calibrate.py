"""Calibration: one scale per term group, fitted on measured peaks, and the allocator's slack."""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from training.config import DrafterConfig
from training.drafters.eagle3.memory.terms import (
    GROUPS,
    PHASES,
    StepShape,
    analytic_phases,
    backward_per_token,
    group_totals,
    saved_per_token,
    saved_per_token_diag,
    saved_per_token_later_step,
    saved_per_token_step,
)

# A calibration whose fit misses a measurement by more than this is refused: the model's
# structure does not describe that trainer.
MAX_FIT_ERROR = 0.25
# How strongly a calibration keeps the analytic scales: moving a scale 0.3 from 1 costs as
# much as missing one measurement by 1 %.
PRIOR_WEIGHT = 0.03


@dataclass(frozen=True)
class Measurement:
    max_seq_len: int
    ttt_steps: int
    peak_bytes: int  # forward+backward peak, torch.cuda.max_memory_allocated
    reserved_bytes: int | None = None  # torch.cuda.max_memory_reserved, when known


@dataclass
class Calibration:
    """One multiplier per term group, fitted on measured peaks, and the allocator's
    measured slack: reserved beyond allocated at the probe's largest step."""

    scales: dict[str, float]
    reserved_slack: int = 0
    fitted_on: dict = field(default_factory=dict)  # config, step shape, measurements

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Calibration:
        scales = d.get("scales")
        if not isinstance(scales, dict) or set(scales) != set(GROUPS):
            raise ValueError(f"calibration needs scales for {', '.join(GROUPS)}")
        return cls(scales={g: float(scales[g]) for g in GROUPS},
                   reserved_slack=int(d.get("reserved_slack", 0)),
                   fitted_on=dict(d.get("fitted_on", {})))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> Calibration:
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except (json.JSONDecodeError, TypeError, AttributeError) as e:
            raise ValueError(f"{path}: not a calibration file ({e})") from e


def _fit_scales(X: list[list[float]], y: list[float]) -> list[float]:
    """Scales s minimising Σ ((X s - y) / y)² + Σ (PRIOR_WEIGHT (s - 1))²: the analytic
    terms are the prior, so directions the rows leave open stay at 1 and a probe's
    1 %-level noise cannot swing a poorly separated group (kimi-k2's per-token scale went
    to 0.19 from five recorded H200 points without it). A group that would go
    non-positive keeps its analytic scale and the others are refitted."""
    n = len(X[0])
    scales = [1.0] * n
    free = list(range(n))
    while free:
        # Rows: each measurement's relative error, with the fixed groups' bytes moved to
        # the right-hand side; then one prior row per free scale.
        A = [[row[j] / peak for j in free] for row, peak in zip(X, y)]
        A += [[PRIOR_WEIGHT if j == i else 0.0 for j in free] for i in free]
        fixed = [sum(row[j] * scales[j] for j in range(n) if j not in free) for row in X]
        b = [1 - f / peak for f, peak in zip(fixed, y)] + [PRIOR_WEIGHT] * len(free)
        for j, s in zip(free, _least_squares(A, b)):
            scales[j] = s
        stuck = [i for i in free if scales[i] <= 0]
        if not stuck:
            break
        for i in stuck:
            scales[i] = 1.0
        free = [i for i in free if i not in stuck]
    return scales


def _least_squares(A: list[list[float]], b: list[float]) -> list[float]:
    """x minimising |A x - b|² for A of full column rank (the prior rows make it so), by
    Householder QR: a handful of unknowns, so plain Python, and no torch or numpy on an
    operator's laptop."""
    R = [list(row) for row in A]
    c = list(b)
    m, n = len(R), len(R[0])
    for j in range(n):
        norm = math.sqrt(sum(R[i][j] ** 2 for i in range(j, m)))
        # the reflection away from the column's sign: no cancellation in v[j]
        v = [R[j][j] + math.copysign(norm, R[j][j])] + [R[i][j] for i in range(j + 1, m)]
        vv = sum(x * x for x in v)
        for k in range(j, n):
            f = 2 * sum(v[i - j] * R[i][k] for i in range(j, m)) / vv
            for i in range(j, m):
                R[i][k] -= f * v[i - j]
        f = 2 * sum(v[i - j] * c[i] for i in range(j, m)) / vv
        for i in range(j, m):
            c[i] -= f * v[i - j]
    x = [0.0] * n
    for j in reversed(range(n)):
        x[j] = (c[j] - sum(R[j][k] * x[k] for k in range(j + 1, n))) / R[j][j]
    return x


def calibrate(cfg: DrafterConfig, measurements: list[Measurement],
              shape: StepShape | None = None) -> Calibration:
    """Fit the group scales to measured forward+backward peaks of steps shaped as `shape`
    (batch rows, precision, ...), each at its own max_seq_len and TTT depth.

    Least squares on relative error with the analytic scales (1) as a weak prior, each
    measurement against the phase that peaks for it under the current scales, until that
    assignment settles. Measurements that cannot separate the groups (one point; or every
    point at the same TTT depth, where per-token and per-step bytes move together) leave
    the unresolved directions near the analytic values.
    """
    if not measurements:
        raise ValueError("calibration needs at least one measurement")
    base = shape or StepShape(1, 1)
    shapes = [dataclasses.replace(base, max_seq_len=m.max_seq_len, ttt_steps=m.ttt_steps)
              for m in measurements]
    by_phase = [group_totals(cfg, s) for s in shapes]  # [n][phase][group]
    y = [float(m.peak_bytes) for m in measurements]
    if any(peak <= 0 for peak in y):
        raise ValueError("measured peaks must be positive")

    def phase_peaks(scales: list[float]) -> list[list[float]]:
        return [[sum(t * s for t, s in zip(group, scales)) for group in phases]
                for phases in by_phase]

    scales = [1.0] * len(GROUPS)
    seen = set()
    while True:
        peak = tuple(max(range(len(PHASES)), key=row.__getitem__) for row in phase_peaks(scales))
        if peak in seen:  # settled (or cycling: keep the last fit)
            break
        seen.add(peak)
        scales = _fit_scales([phases[p] for phases, p in zip(by_phase, peak)], y)
    errors = [(max(row) - m) / m for row, m in zip(phase_peaks(scales), y)]
    worst = max(range(len(errors)), key=lambda i: abs(errors[i]))
    if abs(errors[worst]) > MAX_FIT_ERROR:
        m = measurements[worst]
        raise ValueError(
            f"measurements do not fit the memory model: {errors[worst]:+.0%} at "
            f"max_seq_len {m.max_seq_len}, TTT {m.ttt_steps}")
    # The largest point's allocator slack: the fixed part of what the allocator holds
    # beyond the allocated peak (see peak.RESERVED_RATIO and peak.CACHED_ROW_BLOCKS for the
    # parts that grow).
    largest = max(measurements, key=lambda m: m.peak_bytes)
    fitted = dict(zip(GROUPS, scales))
    return Calibration(
        scales=fitted,
        reserved_slack=max(0, largest.reserved_bytes - largest.peak_bytes)
        if largest.reserved_bytes else 0,
        fitted_on={"config": cfg.to_dict(),
                   "shape": {k: v for k, v in dataclasses.asdict(base).items()
                             if k not in ("max_seq_len", "ttt_steps")},
                   "measurements": [dataclasses.asdict(m) for m in measurements],
                   "max_error": abs(errors[worst]),
                   "coefficients": coefficients(cfg, shapes[0], fitted)})


def coefficients(cfg: DrafterConfig, shape: StepShape, scales: dict[str, float]) -> dict:
    """The fitted model in bytes, per phase: peak = max over phases of constant + T·(per_token
    + per_token_step·K + per_token_later_step·(K-1) + per_token_diag_key·K(K-1)/2),
    T = batch_rows × max_seq_len."""
    p = shape.precision
    constant = {phase: sum(terms["constant"].values()) * scales["constant"]
                for phase, terms in analytic_phases(cfg, shape).items()}
    per_token = sum(saved_per_token(cfg, p).values())
    return {
        "constant": constant,
        "per_token": {phase: (per_token + sum(extra.values())) * scales["per_token"]
                      for phase, extra in backward_per_token(cfg, p).items()},
        "per_token_step": sum(saved_per_token_step(cfg, p).values()) * scales["per_step"],
        "per_token_later_step": sum(saved_per_token_later_step(cfg, p).values())
        * scales["per_step"],
        "per_token_diag_key": sum(saved_per_token_diag(cfg, p).values()) * scales["diagonal"],
    }
