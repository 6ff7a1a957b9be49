"""Predicted vs measured peak memory of a training step, on one GPU under a memory cap.

For each drafter shape: calibrate the memory model with one probe (`trackside fit --probe`'s
six short steps), then measure the real peak of full training steps (forward, backward,
grad clipping, fused AdamW) at (max_seq_len, TTT) pairs from 4K to 64K and TTT 1 to 7,
under torch.cuda.set_per_process_memory_fraction for the cap, OOMs caught and recorded.
Then `largest_fitting` for TTT 5, a real step there and one at the next multiple up.

    python bench/memory_probe.py                 # H200: kimi-k2 and llama3-8b, cap 96 GiB
    python bench/memory_probe.py --smoke         # CPU: the tiny preset, the code paths only

Prints progress, then a Markdown report; with OUT set, also writes $OUT/memory.md and
$OUT/memory.json. New pairs stop after --budget-s (default 200 s, shared by the shapes;
flex_attention compiles once per row length); the largest-fitting checks always run.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from training.drafters.eagle3 import memory  # noqa: E402
from training.config import PRESETS  # noqa: E402
from training.device import use_cuda_allocator_settings  # noqa: E402
from training.drafters.eagle3.memory import GiB, StepShape  # noqa: E402
from training.drafters.eagle3.probe import (PROBE_POINTS, SMOKE_POINTS, ProbeError, Trainer,  # noqa: E402
                            run_probe)

# Lengths shared with the probe where possible (flex_attention compiles once per length),
# none a probe point: each pair checks the calibration.
# The last of each is predicted not to fit 96 GiB: it should OOM.
PAIRS = {
    "kimi-k2": [(4096, 7), (8192, 5), (8192, 7), (16384, 1), (16384, 3), (16384, 5),
                (49152, 1), (65536, 1), (32768, 3), (32768, 5)],
    "llama3-8b": [(4096, 7), (8192, 5), (16384, 1), (16384, 3), (16384, 7), (32768, 5),
                  (65536, 1), (65536, 3), (65536, 5)],
}
SMOKE_PAIRS = {"tiny": [(128, 7), (256, 2), (384, 1), (128, 4)]}
LARGEST_TTT = 5


@dataclasses.dataclass
class Row:
    shape: str
    max_seq_len: int
    ttt_steps: int
    predicted: int
    measured: int | None = None  # None: out of memory, or skipped
    reserved: int | None = None
    seconds: float | None = None
    note: str = ""

    @property
    def error(self) -> float | None:
        if self.measured is None:
            return None
        return (self.predicted - self.measured) / self.measured


def measure(trainer: Trainer, name: str, length: int, k: int, calibration, loss_chunk: int,
            deadline: float) -> Row:
    cfg = trainer.cfg
    shape = StepShape(length, k, loss_chunk=loss_chunk, precision=trainer.precision)
    row = Row(name, length, k, memory.predict(cfg, shape, calibration).total)
    if time.monotonic() > deadline:
        row.note = "skipped: time budget"
        return row
    try:
        peak = trainer.measure(length, k, loss_chunk=loss_chunk)
    except torch.OutOfMemoryError:
        peak = None  # release below: the exception's frames still hold the step's tensors
    if peak is None:
        trainer.release()
        row.note = "OOM"
        return row
    row.measured, row.reserved, row.seconds = peak.peak, peak.reserved, peak.seconds
    return row


def run_shape(name: str, device: torch.device, pairs, points, cap_gib: float,
              multiple: int, loss_chunk: int, deadline: float, log) -> dict:
    cfg = PRESETS[name]
    trainer_started = time.monotonic()
    trainer = Trainer(cfg, device)
    base = StepShape(points[0][0], points[0][1], loss_chunk=loss_chunk,
                     precision=trainer.precision)
    log(f"{name}: probing {len(points)} small steps")
    probe_started = time.monotonic()
    try:
        calibration = run_probe(cfg, base, points=points, trainer=trainer, log=log)
    except ProbeError as e:  # still measure: the analytic model's table is worth having
        log(f"{name}: probe failed ({e}); predictions are the analytic model's")
        calibration = None
    probe_s = time.monotonic() - probe_started
    if calibration is not None:
        log(f"{name}: scales {calibration.scales}, fit error "
            f"{calibration.fitted_on['max_error']:.1%}, probe {probe_s:.0f} s")
    # Cheapest first: an OOM late cannot disturb the measurements before it.
    ordered = sorted(pairs, key=lambda p: memory.predict(
        cfg, dataclasses.replace(base, max_seq_len=p[0], ttt_steps=p[1]), calibration).total)
    rows = []
    for length, k in ordered:
        row = measure(trainer, name, length, k, calibration, loss_chunk, deadline)
        log(format_row(row))
        rows.append(row)
    largest = memory.largest_fitting(cfg, LARGEST_TTT, cap_gib, shape=base, multiple=multiple,
                                     calibration=calibration)
    checks = []  # the acceptance test: never skipped for time
    for length in (largest, largest + multiple) if largest else ():
        row = measure(trainer, name, length, LARGEST_TTT, calibration, loss_chunk, math.inf)
        log(format_row(row))
        checks.append(row)
    del trainer
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"shape": name, "calibration": calibration, "probe_s": probe_s,
            "probe_points": len(points),
            "rows": rows, "largest": largest, "checks": checks,
            "seconds": time.monotonic() - trainer_started}


def format_row(row: Row) -> str:
    measured = f"{row.measured / GiB:.2f}" if row.measured is not None else row.note
    reserved = f"{row.reserved / GiB:.2f}" if row.reserved is not None else "–"
    error = f"{row.error:+.1%}" if row.error is not None else "–"
    seconds = f"{row.seconds:.1f}" if row.seconds is not None else "–"
    return (f"| {row.shape} | {row.max_seq_len:,} | {row.ttt_steps} | "
            f"{row.predicted / GiB:.2f} | {measured} | {error} | {reserved} | {seconds} |")


def report(results: list[dict], cap_gib: float, device_name: str, command: str,
           multiple: int) -> str:
    head = ("| drafter | max_seq_len | TTT | predicted GiB | measured GiB | error | "
            "reserved GiB | step s |\n|---|---:|---:|---:|---:|---:|---:|---:|")
    lines = [f"## Memory model: predicted vs measured peak ({device_name}, cap {cap_gib:g} GiB)",
             "", f"Command: `{command}`", "",
             "Peak = torch.cuda.max_memory_allocated over a full training step (forward, "
             "backward, grad clipping, fused AdamW), measured on the second step of each "
             "pair; predicted = `training.drafters.eagle3.memory.predict`, calibrated by one probe "
             "(`trackside fit --probe`: one warm-up and one measured step at each of "
             f"{results[0]['probe_points']} small (max_seq_len, TTT) points). OOM = "
             "torch.OutOfMemoryError under the cap.", "", head]
    for r in results:
        lines += [format_row(row) for row in r["rows"]]
    errors = [abs(row.error) for r in results for row in r["rows"] if row.error is not None]
    if errors:
        lines += ["", f"Largest |error|: {max(errors):.1%} over {len(errors)} measured pairs."]
    lines += ["", f"### largest_fitting(TTT {LARGEST_TTT}, {cap_gib:g} GiB, "
              f"multiple {multiple}), then launched", "",
              "As `trackside fit --gpu-mem-gib "
              f"{cap_gib:g}` computes it: predicted reserved memory (the largest of "
              f"allocated × {memory.RESERVED_RATIO:g}, allocated + the probe's measured "
              f"allocator slack, allocated + {memory.CACHED_ROW_BLOCKS} cached fp32 "
              "[tokens, hidden] blocks) within the card less "
              f"{memory.DEFAULT_HEADROOM_GIB:g} GiB for the CUDA context, which the cap "
              "leaves out.", "", head]
    for r in results:
        lines += [format_row(row) for row in r["checks"]]
    lines.append("")
    for r in results:
        cal = r["calibration"]
        scales = (", ".join(f"{g} {s:.3f}" for g, s in cal.scales.items())
                  + f"; fit error {cal.fitted_on['max_error']:.1%}") if cal else "probe failed"
        if not r["checks"]:
            lines.append(f"- {r['shape']}: nothing fits {cap_gib:g} GiB at TTT {LARGEST_TTT}. "
                         f"Calibration: {scales}")
            continue
        fit_row, up_row = r["checks"]
        fit_ok = fit_row.measured is not None
        if up_row.measured is not None:
            up = (f"{up_row.measured / GiB:.2f} GiB allocated, {up_row.reserved / GiB:.2f} "
                  f"GiB reserved = {up_row.reserved / (cap_gib * GiB):.1%} of the cap"
                  if up_row.reserved is not None else f"{up_row.measured / GiB:.2f} GiB")
        else:
            up = up_row.note
        lines.append(f"- {r['shape']}: largest fitting {r['largest']:,} "
                     f"({'trains' if fit_ok else fit_row.note}); next multiple "
                     f"{r['largest'] + multiple:,}: {up}. Launches needed: one probe "
                     f"({r['probe_s']:.0f} s). Calibration scales: {scales}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="CPU, tiny preset: code paths only")
    p.add_argument("--cap-gib", type=float, default=96.0)
    p.add_argument("--shapes", default="kimi-k2,llama3-8b")
    p.add_argument("--loss-chunk", type=int, default=2048)
    p.add_argument("--budget-s", type=float, default=200.0,
                   help="stop measuring new pairs after this many seconds (the largest "
                        "fitting checks still run)")
    args = p.parse_args(argv)
    started = time.monotonic()
    use_cuda_allocator_settings()
    if args.smoke:
        device, shapes, pairs, points = torch.device("cpu"), ["tiny"], SMOKE_PAIRS, SMOKE_POINTS
        cap_gib, multiple = 1.02, 128  # 20 MiB above the headroom: a few hundred tokens
        device_name = "CPU smoke: saved-tensor bytes, the cap not enforced"
    else:
        if not torch.cuda.is_available():
            print("memory_probe: no CUDA GPU; use --smoke on CPU", file=sys.stderr)
            return 1
        device = torch.device("cuda", 0)
        shapes, pairs, points = args.shapes.split(","), PAIRS, PROBE_POINTS
        cap_gib, multiple = args.cap_gib, 1024
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, cap_gib * GiB / total), device)
        device_name = f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}"
        # One flex_attention compile per row length, over both shapes.
        for knob in ("cache_size_limit", "recompile_limit"):
            if hasattr(torch._dynamo.config, knob):
                setattr(torch._dynamo.config, knob, 64)
    # Each shape gets its share of the budget, so a slow first one cannot starve the next.
    results = [run_shape(name, device, pairs[name], points, cap_gib, multiple,
                         args.loss_chunk, started + args.budget_s * (i + 1) / len(shapes),
                         lambda s: print(f"[{time.monotonic() - started:5.0f} s] {s}",
                                         flush=True))
               for i, name in enumerate(shapes)]
    command = "python bench/memory_probe.py" + (" --smoke" if args.smoke else "")
    text = report(results, cap_gib, device_name, command, multiple)
    text += f"\n\nTotal {time.monotonic() - started:.0f} s.\n"
    print(text)
    out = os.environ.get("OUT")
    if out:
        Path(out, "memory.md").write_text(text)
        Path(out, "memory.json").write_text(json.dumps([
            {**{k: v for k, v in r.items() if k not in ("rows", "checks", "calibration")},
             "calibration": r["calibration"] and r["calibration"].to_dict(),
             "rows": [dataclasses.asdict(row) for row in r["rows"]],
             "checks": [dataclasses.asdict(row) for row in r["checks"]]}
            for r in results], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
