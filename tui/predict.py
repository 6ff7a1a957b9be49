"""What an edit will cost, before paying for a launch: steps, epoch time, peak memory.

Steps and time come from the run's own measurements (steps per epoch, tokens per step,
tokens/s); memory from each drafter's memory model (plain arithmetic, no torch),
calibrated on the run's measured peak.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from training.drafters.dflash import memory as dflash_memory
from training.drafters.eagle3 import memory
from training.drafters.measured import shape_from_start
from training.memory.measured import unmodelled_fp8
from training.params import count_recomputed
from tui.state import RunState


@dataclass(frozen=True)
class Cost:
    steps_per_epoch: int | None
    epoch_s: float | None
    peak_gib: float | None
    largest_max_seq_len: int | None  # that fits the GPU at the new TTT depth
    fewest_checkpoint_ttt: int | None  # TTT steps to recompute for the new step to fit
    largest_max_anchors: int | None = None  # DFlash: that fits the GPU at the new block size


@dataclass(frozen=True)
class Basis:
    """What a prediction reads of a run, copied on the UI thread: a worker thread then
    predicts from it while the run's buffers keep growing."""

    params: dict
    last: dict | None  # the latest step event
    steps_per_epoch: int | None
    start: dict | None
    peak_mem_gib: float | None  # the highest the run measured

    @classmethod
    def of(cls, run: RunState) -> Basis:
        peaks = [e["peak_mem_gib"] for e in run.steps if e.get("peak_mem_gib")]
        return cls(run.params, run.last, run.steps_per_epoch, run.start, max(peaks, default=None))

    def predict(self, changes: dict, gpu_mem_gib: float | None = None) -> Cost:
        params = {**self.params, **changes}
        return Cost(*_schedule(self, params), *_memory(self, params, gpu_mem_gib))


def no_memory_model(basis: Basis, params: dict) -> str:
    """Why the edit (params, the run's with the changes) has no predicted peak, in words of
    ours (the start event is anyone's)."""
    if unmodelled_fp8(params):
        return unmodelled_fp8(params)
    if not basis.start:
        return "no start event yet: predicted once the run has started"
    config = basis.start.get("config")
    device = config.get("device", "cuda") if isinstance(config, dict) else "cuda"
    if device != "cuda":
        return f"{'a CPU run' if device == 'cpu' else 'not a CUDA run'}: no GPU memory to predict"
    try:
        shape_from_start(basis.start)
    except ValueError:
        return "its start event does not describe a drafter the memory model knows"
    return "the memory model failed on these values"


def _peak_bytes(basis: Basis) -> int | None:
    return round(basis.peak_mem_gib * memory.GiB) if basis.peak_mem_gib else None


def _schedule(basis: Basis, params: dict) -> tuple[int | None, float | None]:
    """An epoch holds the same tokens whatever the row length; rows fill as they do now."""
    last, spe, old = basis.last, basis.steps_per_epoch, basis.params
    if not last or not spe:
        return None, None
    old_rows = old.get("max_seq_len", 0) * old.get("batch_rows", 1)
    new_rows = params.get("max_seq_len", 0) * params.get("batch_rows", 1)
    new_spe = max(1, round(spe * old_rows / new_rows)) if old_rows and new_rows else None
    rate, tokens = last.get("tokens_per_s"), last.get("tokens")
    if not rate or not tokens:
        return new_spe, None
    return new_spe, spe * tokens / rate * _work(params) / (_work(old) or _work(params))


def _work(params: dict) -> float:
    """A row's drafter work, up to a constant: each EAGLE-3 TTT step is another forward
    and backward of the drafter; each DFlash block position goes through every draft
    layer (the context's share, which does not grow with the blocks, is left out: an
    upper bound on the change)."""
    if "max_anchors" in params:
        return params["max_anchors"] * params.get("block_size", 1)
    return params.get("ttt_steps", 1)


def _memory(basis: Basis, params: dict, gpu_mem_gib: float | None
            ) -> tuple[float | None, int | None, int | None, int | None]:
    """Predicted peak (GiB reserved), then for EAGLE-3 the largest max_seq_len and fewest
    TTT steps recomputed that fit, for DFlash the largest max_anchors."""
    if not basis.start or unmodelled_fp8(params):
        return None, None, None, None
    try:
        cfg, shape = shape_from_start(basis.start)
        if isinstance(shape, dflash_memory.DFlashShape):
            return _dflash_memory(basis, cfg, shape, params, gpu_mem_gib)
        calibration = None
        if basis.peak_mem_gib:
            measured = memory.Measurement(shape.max_seq_len, shape.ttt_steps, _peak_bytes(basis))
            calibration = memory.calibrate(cfg, [measured], shape)
        changed = {k: int(params[k]) for k in ("max_seq_len", "ttt_steps", "batch_rows", "loss_chunk") if k in params}
        changed["checkpoint_ttt"] = count_recomputed(params.get("checkpoint_ttt", shape.checkpoint_ttt))
        changed["freeze_lm_head"] = bool(params.get("freeze_lm_head", shape.freeze_lm_head))
        new = dataclasses.replace(shape, **changed)
        peak = memory.predict(cfg, new, calibration).reserved / memory.GiB
        largest = fewest = None
        if gpu_mem_gib:
            largest = memory.largest_fitting(cfg, new.ttt_steps, gpu_mem_gib, shape=new, calibration=calibration)
            fewest = memory.fewest_checkpoint_ttt(cfg, new, gpu_mem_gib, calibration=calibration)
        return peak, largest, fewest, None
    # The model's refusals: a start event it cannot read (ValueError), values it does not
    # describe (ValueError, TypeError: the run dir's JSON is anyone's), numbers out of its
    # range (a zero, an overflow). They read as "—"; anything else is a bug, for the app's
    # error policy to show.
    except (ValueError, TypeError, ArithmeticError):
        return None, None, None, None


def _dflash_memory(basis: Basis, cfg, shape, params: dict, gpu_mem_gib: float | None
                   ) -> tuple[float | None, None, None, int | None]:
    """A DFlash run's edit: the model scaled to the run's own measured peak (where the
    model describes it), then the changed block size, anchors, soft KL, rows and chunk."""
    scale = 1.0
    peak_bytes = _peak_bytes(basis)
    if peak_bytes:
        try:
            scale = dflash_memory.calibrate(cfg, shape, peak_bytes)
        except ValueError:  # a peak the model does not describe: the analytic prediction
            pass
    new_cfg = dataclasses.replace(cfg, block_size=int(params.get("block_size", cfg.block_size)))
    changed = {k: int(params[k]) for k in ("max_seq_len", "max_anchors", "batch_rows", "loss_chunk") if k in params}
    if "soft_kl" in params:
        changed["soft_kl"] = float(params["soft_kl"])
    new = dataclasses.replace(shape, **changed)
    peak = dflash_memory.predict(new_cfg, new, scale).reserved / memory.GiB
    largest = dflash_memory.largest_max_anchors(new_cfg, new, gpu_mem_gib, scale=scale) if gpu_mem_gib else None
    return peak, None, None, largest
