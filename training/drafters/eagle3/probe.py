"""The probe harness: a drafter and optimizer as the training loop sets them up, stepped on
random batches of a given shape while their peak memory is measured (CUDA's allocator
statistics, or on the CPU the bytes autograd saves), and `run_probe`, which calibrates
the memory model with a few such steps. `trackside fit --probe`, the tests and the
benchmarks use it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import time
from dataclasses import dataclass

import torch

from training.config import DrafterConfig
from training.device import precision, use_cuda_allocator_settings
from training.drafters.eagle3.model import Eagle3Drafter, StepLoss
from training.drafters.eagle3.step import Unroll, forward_backward
from training.drafters.eagle3 import memory
from training.drafters.eagle3.memory import Calibration, GiB, Measurement, StepShape
from training.optimizer import GRAD_CLIP, LR, make_optimizer, optimizer_step
from training.packing import PackedBatch
from training.params import PARAMS

# Six steps separate the four term groups: lengths at TTT 1 give the per-token slope, TTT
# 3 and 5 the linear and quadratic growth with depth. The long TTT-1 row is cheap (one
# step's activations) and reaches the regime long rows peak in (the final norm's
# backward, not the loss's), where 4096 and 8192 alone left the per-token slope loose.
PROBE_POINTS = ((4096, 1), (8192, 1), (4096, 3), (8192, 3), (4096, 5), (32768, 1))
SMOKE_POINTS = ((128, 1), (256, 1), (128, 3), (256, 3), (128, 4))
PROBE_SAMPLE_LEN = 2048  # random batches pack samples of this length, as real data would


class ProbeError(Exception):
    """The probe could not measure (no GPU, out of memory, a wrong precision): exit 1."""


@dataclass(frozen=True)
class StepPeak:
    """What one training step held: the forward+backward and optimizer-step peaks."""

    max_seq_len: int
    ttt_steps: int
    forward_backward: int  # bytes, max_memory_allocated
    optimizer_step: int
    reserved: int | None  # bytes, max_memory_reserved over the step
    seconds: float

    @property
    def peak(self) -> int:
        return max(self.forward_backward, self.optimizer_step)

    def measurement(self) -> Measurement:
        return Measurement(self.max_seq_len, self.ttt_steps, self.forward_backward,
                           self.reserved)


def random_batch(cfg: DrafterConfig, max_seq_len: int, batch_rows: int,
                 device: torch.device, dtype: torch.dtype,
                 sample_len: int = PROBE_SAMPLE_LEN) -> PackedBatch:
    """A packed batch of the right shapes: rows of samples of sample_len tokens, every
    position scored (the worst case the memory model assumes)."""
    B, L, H = batch_rows, max_seq_len, cfg.hidden_size
    n = min(sample_len, L)
    col = torch.arange(L, device=device).expand(B, L)
    g = torch.Generator(device=device).manual_seed(0)
    return PackedBatch(
        input_ids=torch.randint(cfg.vocab_size, (B, L), device=device, generator=g),
        position_ids=(col % n).contiguous(), doc_ids=(col // n).contiguous(),
        loss_mask=torch.ones(B, L, dtype=torch.bool, device=device),
        aux_hidden=torch.randn(B, L, 3 * H, device=device, dtype=dtype, generator=g),
        final_hidden=torch.randn(B, L, H, device=device, dtype=dtype, generator=g),
        num_samples=B * math.ceil(L / n), num_truncated=0, pad_tokens=0)


class Trainer:
    """A drafter and its optimizer as training/loop.py sets them up (random weights:
    memory does not depend on their values), stepped by the loop's own step functions."""

    def __init__(self, cfg: DrafterConfig, device: torch.device,
                 ttt_decay: float = PARAMS["ttt_decay"].default, checkpoint_ttt: int = 0,
                 freeze_lm_head: bool = False, fp8: bool = False):
        self.cfg, self.device, self.ttt_decay = cfg, device, ttt_decay
        self.checkpoint_ttt = checkpoint_ttt
        with torch.device(device):  # initialise in place: a 1B-parameter drafter is slow on CPU
            self.drafter = Eagle3Drafter(cfg, fp8)
            # a random verifier in the dtype extract.py writes, loaded as the loop loads one
            V, D, H = cfg.vocab_size, cfg.draft_vocab_size, cfg.hidden_size
            self.drafter.load_verifier(*(torch.randn(V, H, dtype=torch.bfloat16) * 0.02
                                         for _ in range(2)),
                                       torch.arange(D), torch.arange(V) < D)
        if freeze_lm_head:
            self.drafter.freeze_lm_head()
        self.model = Unroll(self.drafter)
        self.params = [p for p in self.drafter.parameters() if p.requires_grad]
        self.optimizer = make_optimizer(self.params, LR, device)
        self.precision = precision(device)
        self.dtype = torch.bfloat16 if self.precision == "bf16" else torch.float32

    def forward_backward(self, batch: PackedBatch, ttt_steps: int, loss_chunk: int,
                         host: PackedBatch | None = None) -> list[StepLoss]:
        per_step, _ = forward_backward(self.model, batch, ttt_steps, self.ttt_decay,
                                       loss_chunk, checkpoint=self.checkpoint_ttt, host=host)
        return per_step

    def optimizer_step(self, apply=None) -> None:
        """apply: as optimizer_step takes it (the trainer's Verdict)."""
        optimizer_step(self.optimizer, self.params, GRAD_CLIP, apply=apply)

    def measure(self, max_seq_len: int, ttt_steps: int, *, batch_rows: int = 1,
                loss_chunk: int = 2048, steps: int = 2) -> StepPeak:
        """Run `steps` steps; the last one's peaks, with AdamW's state already allocated."""
        batch = random_batch(self.cfg, max_seq_len, batch_rows, self.device, self.dtype)
        # Each step's losses stay referenced, as the loop keeps them for its metrics, through
        # the optimizer step and the next step's forward and backward.
        for _ in range(steps - 1):
            per_step = self.forward_backward(batch, ttt_steps, loss_chunk)
            self.optimizer_step()
        meter = CudaMeter(self.device) if self.device.type == "cuda" else SavedTensorMeter(self)
        started = time.perf_counter()
        with meter.phase() as fb:
            per_step = self.forward_backward(batch, ttt_steps, loss_chunk)
        with meter.phase() as opt:
            self.optimizer_step()
        seconds = time.perf_counter() - started
        reserved = None if fb.reserved is None else max(fb.reserved, opt.reserved)
        return StepPeak(max_seq_len, ttt_steps, fb.allocated, opt.allocated, reserved,
                        seconds)

    def release(self) -> None:
        """After an OOM: drop the gradients the failed step left behind."""
        self.optimizer.zero_grad(set_to_none=True)
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


@dataclass
class PhasePeak:
    allocated: int = 0
    reserved: int | None = None


class CudaMeter:
    def __init__(self, device: torch.device):
        self.device = device

    @contextlib.contextmanager
    def phase(self):
        peak = PhasePeak()
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()  # reserved then measures this phase, not earlier ones
        torch.cuda.reset_peak_memory_stats(self.device)
        yield peak
        torch.cuda.synchronize(self.device)
        peak.allocated = torch.cuda.max_memory_allocated(self.device)
        peak.reserved = torch.cuda.max_memory_reserved(self.device)


class SavedTensorMeter:
    """CPU stand-in for max_memory_allocated (CPU has no allocator statistics): the bytes
    of the model, its gradients and optimizer state, plus every distinct storage autograd
    saved for backward during the phase. Misses transient workspaces; for smoke runs."""

    def __init__(self, trainer: Trainer):
        self.trainer = trainer

    @contextlib.contextmanager
    def phase(self):
        peak = PhasePeak()
        with count_saved_bytes(exclude=state_tensors(self.trainer)) as saved:
            yield peak
        peak.allocated = state_bytes(self.trainer) + saved.nbytes


class SavedBytes:
    def __init__(self):
        self.storages: dict[int, int] = {}

    @property
    def nbytes(self) -> int:
        return sum(self.storages.values())


@contextlib.contextmanager
def count_saved_bytes(exclude=()):
    """The distinct storages autograd saves for backward inside the block, in bytes,
    leaving out those of the `exclude` tensors (parameters: counted as weights)."""
    saved = SavedBytes()
    skip = {t.untyped_storage().data_ptr() for t in exclude}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in skip:
            saved.storages[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield saved


def state_tensors(trainer: Trainer) -> list[torch.Tensor]:
    """Parameters, buffers, gradients and optimizer state."""
    tensors = list(trainer.drafter.parameters()) + list(trainer.drafter.buffers())
    tensors += [p.grad for p in trainer.params if p.grad is not None]
    tensors += [t for state in trainer.optimizer.state.values() for t in state.values()
                if isinstance(t, torch.Tensor)]
    return tensors


def state_bytes(trainer: Trainer) -> int:
    return sum(t.numel() * t.element_size() for t in state_tensors(trainer))


def probe_points(cfg: DrafterConfig, shape: StepShape, gpu_bytes: int):
    """PROBE_POINTS, halved in length until the analytic model puts them all within 80 %
    of the GPU's memory: a smaller card still gets a probe, at shorter rows."""
    points = PROBE_POINTS
    while points[0][0] > 512 and max(
            memory.predict(cfg, dataclasses.replace(shape, max_seq_len=n, ttt_steps=k)).total
            for n, k in points) > 0.8 * gpu_bytes:
        points = tuple((n // 2, k) for n, k in points)
    return points


def run_probe(cfg: DrafterConfig, shape: StepShape, *, points=None,
              device: torch.device | None = None, trainer: Trainer | None = None,
              log=print) -> Calibration:
    """Calibrate the memory model with one real step (after a warm-up step) per point."""
    if trainer is None:
        if device is None:
            use_cuda_allocator_settings()  # the trainer's allocator, so its slack is measured
            if not torch.cuda.is_available():
                raise ProbeError("--probe needs a CUDA GPU (none is visible)")
            device = torch.device("cuda", torch.cuda.current_device())
        trainer = Trainer(cfg, device, checkpoint_ttt=shape.checkpoint_ttt,
                          freeze_lm_head=shape.freeze_lm_head)
    if shape.precision != trainer.precision:
        raise ProbeError(f"--precision {shape.precision}: the trainer uses "
                         f"{trainer.precision} on {trainer.device.type}")
    if points is None:
        total = torch.cuda.get_device_properties(trainer.device).total_memory
        points = probe_points(cfg, shape, total)
    measured = []
    for length, k in points:
        try:
            peak = trainer.measure(length, k, batch_rows=shape.batch_rows,
                                   loss_chunk=shape.loss_chunk)
        except torch.OutOfMemoryError as e:
            raise ProbeError(f"out of memory at max_seq_len {length}, TTT {k}: the "
                             "drafter does not fit even the probe's small steps") from e
        measured.append(peak.measurement())
        if log:
            log(f"probe: max_seq_len {length:>6} TTT {k}: forward+backward "
                f"{peak.forward_backward / GiB:.2f} GiB, optimizer step "
                f"{peak.optimizer_step / GiB:.2f} GiB ({peak.seconds:.1f} s)")
    try:
        return memory.calibrate(cfg, measured, dataclasses.replace(shape, world_size=1))
    except ValueError as e:
        raise ProbeError(str(e)) from e
