"""`trackside fit`: predicted peak memory of a training step, and the largest max_seq_len
that fits a card; `--probe` calibrates the prediction with a few real steps on this GPU.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from training import loop, memory
from training.config import PRESETS, DrafterConfig
from training.memory import GiB, Calibration, Measurement, StepShape
from training.model import Eagle3Drafter, StepLoss
from training.packing import PackedBatch

# Six steps separate the four term groups: lengths at TTT 1 give the per-token slope, TTT
# 3 and 5 the linear and quadratic growth with depth. The long TTT-1 row is cheap (one
# step's activations) and reaches the regime long rows peak in (the final norm's
# backward, not the loss's), where 4096 and 8192 alone left the per-token slope loose.
PROBE_POINTS = ((4096, 1), (8192, 1), (4096, 3), (8192, 3), (4096, 5), (32768, 1))
SMOKE_POINTS = ((128, 1), (256, 1), (128, 3), (256, 3), (128, 4))
TABLE_LENGTHS = (4096, 8192, 16384, 24576, 32768, 65536)
TABLE_TTT = (1, 3, 5, 7)
PROBE_SAMPLE_LEN = 2048  # random batches pack samples of this length, as real data would


class UsageError(Exception):
    """A bad value on the command line: exit 2, naming the flag."""


class ProbeError(Exception):
    """The probe could not measure: exit 1."""


def _positive_int(flag: str, value: int | None) -> None:
    if value is not None and value <= 0:
        raise UsageError(f"{flag} must be a positive integer, got {value}")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="trackside fit",
        description="Predict the peak GPU memory of a training step and the largest "
                    "max_seq_len that fits.")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--config", help="drafter config JSON (DrafterConfig fields)")
    src.add_argument("--preset", help=f"built-in drafter shape: {', '.join(PRESETS)}")
    p.add_argument("--gpu-mem-gib", type=float, default=96.0,
                   help="memory of one GPU (default 96)")
    p.add_argument("--max-seq-len", type=int, help="tokens per packed row (default: the "
                   "run's with --from-run, else 16384)")
    p.add_argument("--ttt-steps", type=int, help="TTT depth (default: the run's, else 5)")
    p.add_argument("--batch-rows", type=int, help="rows per step and GPU (default 1)")
    p.add_argument("--loss-chunk", type=int, help="positions per loss chunk (default 2048)")
    p.add_argument("--precision", choices=tuple(memory.PRECISIONS), default=None,
                   help="bf16 autocast (GPU default) or fp32")
    p.add_argument("--world-size", type=int, help="GPUs in the run (default 1)")
    p.add_argument("--sharding", choices=memory.SHARDINGS, default=None,
                   help="ddp (replicated state) or fsdp (sharded)")
    p.add_argument("--checkpoint-ttt", type=int, nargs="?", const=sys.maxsize, default=None,
                   metavar="N", help="as train --checkpoint-ttt: the first N TTT steps "
                   "recomputed in backward (bare: every step)")
    p.add_argument("--freeze-lm-head", action="store_true", default=None,
                   help="as train --freeze-lm-head: the draft head takes no gradient")
    p.add_argument("--multiple", type=int, default=1024,
                   help="round the largest max_seq_len down to a multiple of this")
    p.add_argument("--headroom-gib", type=float, default=memory.DEFAULT_HEADROOM_GIB,
                   help="memory outside the allocator: CUDA context, NCCL (default 1)")
    p.add_argument("--calibration", help="calibration JSON (from --probe); with --probe or "
                   "--from-run, where the new calibration is written")
    p.add_argument("--from-run", action="append", metavar="RUN_DIR",
                   help="re-calibrate from a finished run's metrics.jsonl; repeat for "
                        "several runs of one drafter (more shapes, a better fit)")
    p.add_argument("--probe", action="store_true",
                   help="calibrate with a few real steps on this machine's GPU")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    try:
        args = p.parse_args(argv)
    except SystemExit as e:  # argparse already printed the message (or the help)
        if e.code == 0:
            raise
        raise UsageError("") from e
    for flag in ("max_seq_len", "ttt_steps", "batch_rows", "loss_chunk", "world_size",
                 "multiple"):
        _positive_int("--" + flag.replace("_", "-"), getattr(args, flag))
    if args.checkpoint_ttt is not None and args.checkpoint_ttt < 0:
        raise UsageError(f"--checkpoint-ttt counts TTT steps (0 or more), got {args.checkpoint_ttt}")
    if not args.gpu_mem_gib > 0 or not math.isfinite(args.gpu_mem_gib):
        raise UsageError(f"--gpu-mem-gib must be positive, got {args.gpu_mem_gib}")
    if not 0 <= args.headroom_gib < args.gpu_mem_gib:
        raise UsageError(f"--headroom-gib must be in [0, --gpu-mem-gib), got {args.headroom_gib}")
    if args.probe and args.from_run:
        raise UsageError("--probe and --from-run both calibrate: give one")
    return args


def load_drafter_config(args: argparse.Namespace) -> DrafterConfig | None:
    if args.preset is not None:
        if args.preset not in PRESETS:
            raise UsageError(f"--preset must be one of {', '.join(PRESETS)}, got {args.preset!r}")
        return PRESETS[args.preset]
    if args.config is not None:
        try:
            data = json.loads(Path(args.config).read_text())
            return DrafterConfig.from_dict(data)
        except OSError as e:
            raise UsageError(f"--config {args.config}: {e.strerror}") from e
        except (json.JSONDecodeError, TypeError, ValueError) as e:
            raise UsageError(f"--config {args.config}: {e}") from e
    return None


def runs_measurements(run_dirs: list[str]) -> tuple[DrafterConfig, StepShape, list[Measurement]]:
    """The runs' common drafter and step settings (the first run's shape), and their peaks."""
    found = []
    for run_dir in run_dirs:
        try:
            found.append(memory.measurements_from_run(run_dir))
        except ValueError as e:
            raise UsageError(f"--from-run {run_dir}: {e}") from e
    cfg, base, _ = found[0]
    for run_dir, (other_cfg, other, _) in zip(run_dirs[1:], found[1:]):
        same = dataclasses.replace(other, max_seq_len=base.max_seq_len,
                                   ttt_steps=base.ttt_steps)
        if other_cfg != cfg or same != base:
            raise UsageError(f"--from-run {run_dir}: not the drafter, batch rows, loss chunk, "
                             f"precision and GPUs of {run_dirs[0]}")
    return cfg, base, [m for _, _, m in found]


def step_shape(args: argparse.Namespace, base: StepShape | None) -> StepShape:
    """The requested step: flags first, then the run's (with --from-run), then defaults."""
    fallback = base or StepShape(16384, 5, precision="bf16")
    values = {name: getattr(args, name) for name in
              ("max_seq_len", "ttt_steps", "batch_rows", "loss_chunk", "precision",
               "world_size", "sharding", "checkpoint_ttt", "freeze_lm_head")}
    try:
        shape = dataclasses.replace(
            fallback, **{k: v for k, v in values.items() if v is not None})
        return dataclasses.replace(
            shape, checkpoint_ttt=min(shape.checkpoint_ttt, shape.ttt_steps))
    except ValueError as e:
        raise UsageError(str(e)) from e


def report(cfg: DrafterConfig, shape: StepShape, args: argparse.Namespace,
           calibration: Calibration | None) -> dict:
    prediction = memory.predict(cfg, shape, calibration)
    largest = {k: memory.largest_fitting(cfg, k, args.gpu_mem_gib, shape=shape,
                                         multiple=args.multiple, calibration=calibration,
                                         headroom_gib=args.headroom_gib)
               for k in sorted({shape.ttt_steps, *TABLE_TTT})}
    fewest = memory.fewest_checkpoint_ttt(cfg, shape, args.gpu_mem_gib,
                                          calibration=calibration,
                                          headroom_gib=args.headroom_gib)
    table = []
    for length in sorted({shape.max_seq_len, *TABLE_LENGTHS}):
        for k in sorted({shape.ttt_steps, *TABLE_TTT}):
            p = memory.predict(cfg, dataclasses.replace(shape, max_seq_len=length,
                                                        ttt_steps=k), calibration)
            table.append({"max_seq_len": length, "ttt_steps": k,
                          "peak_gib": p.total / GiB, "reserved_gib": p.reserved / GiB,
                          "fits": memory.fits(p, args.gpu_mem_gib, args.headroom_gib)})
    return {
        "config": cfg.to_dict(),
        "shape": dataclasses.asdict(shape),
        "gpu_mem_gib": args.gpu_mem_gib,
        "headroom_gib": args.headroom_gib,
        "calibrated": calibration is not None,
        "calibration": calibration.to_dict() if calibration else None,
        "peak_gib": prediction.total / GiB,
        "reserved_gib": prediction.reserved / GiB,
        "forward_backward_gib": prediction.forward_backward / GiB,
        "peak_phase": prediction.phase,
        "optimizer_step_gib": prediction.optimizer_step / GiB,
        "fits": memory.fits(prediction, args.gpu_mem_gib, args.headroom_gib),
        "breakdown_bytes": prediction.breakdown(),
        "largest_max_seq_len": {str(k): v for k, v in largest.items()},
        "fewest_checkpoint_ttt": fewest,
        "table": table,
    }


def checkpointed(n: int, ttt_steps: int) -> str:
    if not n:
        return ""
    return ", every TTT step recomputed" if n >= ttt_steps else \
        f", TTT steps 1-{n} of {ttt_steps} recomputed" if n > 1 else \
        f", TTT step 1 of {ttt_steps} recomputed"


def format_report(r: dict) -> str:
    s = r["shape"]
    verdict = "fits" if r["fits"] else "will not fit"
    largest = r["largest_max_seq_len"][str(s["ttt_steps"])]
    lines = [
        f"{s['max_seq_len']} @ TTT {s['ttt_steps']}: {r['peak_gib']:.1f} GiB predicted "
        f"({r['reserved_gib']:.1f} reserved), card has {r['gpu_mem_gib']:g} GiB — {verdict}; "
        f"largest that fits: {f'{largest:,}' if largest else 'none'}",
        f"  batch rows {s['batch_rows']}, loss chunk {s['loss_chunk']}, {s['precision']}, "
        f"{s['world_size']} GPU(s) {s['sharding']}"
        f"{checkpointed(s['checkpoint_ttt'], s['ttt_steps'])}"
        f"{', draft head frozen' if s['freeze_lm_head'] else ''}, "
        f"{r['headroom_gib']:g} GiB outside the "
        "allocator" + ("" if r["calibrated"] else "; analytic model, uncalibrated (--probe)"),
    ]
    if not r["fits"]:
        n = r["fewest_checkpoint_ttt"]
        lines.append(f"  fits with --checkpoint-ttt {n}" if n is not None else
                     "  does not fit even with every TTT step recomputed (--checkpoint-ttt)")
    if r["calibrated"]:
        fitted = r["calibration"]["fitted_on"]
        lines.append(f"  calibrated on {len(fitted.get('measurements', []))} measured peaks "
                     f"(largest fit error {fitted.get('max_error', float('nan')):.1%}); "
                     "scales " + ", ".join(f"{g} {v:.3f}" for g, v in
                                           r["calibration"]["scales"].items()))
    lines += ["", f"breakdown (GiB; forward+backward peaks in the {r['peak_phase']} phase):"]
    for name, b in sorted(r["breakdown_bytes"].items(), key=lambda kv: -kv[1]):
        lines.append(f"  {name:<28} {b / GiB:9.3f}")
    lines += ["", "largest max_seq_len that fits:"]
    for k, n in r["largest_max_seq_len"].items():
        lines.append(f"  TTT {k}: {n:,}" if n else f"  TTT {k}: none")
    ttts = sorted({row["ttt_steps"] for row in r["table"]})
    lines += ["", "predicted peak GiB (* = does not fit):",
              "  max_seq_len " + "".join(f"{'TTT ' + str(k):>10}" for k in ttts)]
    by_len: dict[int, dict[int, dict]] = {}
    for row in r["table"]:
        by_len.setdefault(row["max_seq_len"], {})[row["ttt_steps"]] = row
    for length, row in by_len.items():
        cells = "".join(f"{row[k]['peak_gib']:9.1f}{' ' if row[k]['fits'] else '*'}"
                        for k in ttts)
        lines.append(f"  {length:>11} {cells}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    argv = argv[1:] if argv and argv[0] == "fit" else argv
    try:
        args = parse_args(argv)
        cfg = load_drafter_config(args)
        calibration, base = None, None
        if args.calibration and not (args.probe or args.from_run):
            try:
                calibration = Calibration.load(args.calibration)
            except (OSError, ValueError) as e:
                raise UsageError(f"--calibration {args.calibration}: {e}") from e
        if args.from_run:
            run_cfg, base, measured = runs_measurements(args.from_run)
            cfg = cfg or run_cfg
            try:
                calibration = memory.calibrate(run_cfg, measured, base)
            except ValueError as e:
                raise UsageError(f"--from-run: {e}") from e
        if cfg is None:
            raise UsageError("give --preset NAME or --config PATH (or --from-run RUN_DIR)")
        shape = step_shape(args, base)
        if args.probe:
            calibration = run_probe(cfg, shape, log=None if args.json else print)
        if calibration is not None and args.calibration and (args.probe or args.from_run):
            try:
                calibration.save(args.calibration)
            except OSError as e:
                raise UsageError(f"--calibration {args.calibration}: {e.strerror}") from e
    except UsageError as e:
        if str(e):
            print(f"trackside fit: {e}", file=sys.stderr)
        return 2
    except ProbeError as e:
        print(f"trackside fit: probe failed: {e}", file=sys.stderr)
        return 1
    r = report(cfg, shape, args, calibration)
    print(json.dumps(r, indent=2) if args.json else format_report(r))
    return 0


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
                 ttt_decay: float = loop.TrainConfig.ttt_decay, checkpoint_ttt: int = 0,
                 freeze_lm_head: bool = False):
        self.cfg, self.device, self.ttt_decay = cfg, device, ttt_decay
        self.checkpoint_ttt = checkpoint_ttt
        with torch.device(device):  # initialise in place: a 1B-parameter drafter is slow on CPU
            self.drafter = Eagle3Drafter(cfg)
            # a random verifier in the dtype extract.py writes, loaded as the loop loads one
            V, D, H = cfg.vocab_size, cfg.draft_vocab_size, cfg.hidden_size
            self.drafter.load_verifier(*(torch.randn(V, H, dtype=torch.bfloat16) * 0.02
                                         for _ in range(2)),
                                       torch.arange(D), torch.arange(V) < D)
        if freeze_lm_head:
            self.drafter.freeze_lm_head()
        self.model = loop.Unroll(self.drafter)
        self.params = [p for p in self.drafter.parameters() if p.requires_grad]
        self.optimizer = loop.make_optimizer(self.params, loop.TrainConfig.lr, device)
        self.precision = loop.precision(device)
        self.dtype = torch.bfloat16 if self.precision == "bf16" else torch.float32

    def forward_backward(self, batch: PackedBatch, ttt_steps: int,
                         loss_chunk: int) -> list[StepLoss]:
        per_step, _ = loop.forward_backward(self.model, batch, ttt_steps, self.ttt_decay,
                                            loss_chunk, checkpoint=self.checkpoint_ttt)
        return per_step

    def optimizer_step(self) -> None:
        loop.optimizer_step(self.optimizer, self.params, loop.TrainConfig.grad_clip)

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
            loop.use_cuda_allocator_settings()  # the trainer's allocator, so its slack is measured
            if not torch.cuda.is_available():
                raise ProbeError("--probe needs a CUDA GPU (none is visible)")
            device = torch.device("cuda", torch.cuda.current_device())
        trainer = Trainer(cfg, device, checkpoint_ttt=shape.checkpoint_ttt,
                          freeze_lm_head=shape.freeze_lm_head)
    if shape.precision != trainer.precision:
        raise UsageError(f"--precision {shape.precision}: the trainer uses "
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
