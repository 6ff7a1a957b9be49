"""`trackside fit` for EAGLE-3: the step's predicted peak on a card, the largest
max_seq_len at each TTT depth, the fewest TTT steps to recompute, what --offload-saved
would make of it, and a table over lengths and depths; `--probe` calibrates the
prediction with a few real steps on this GPU (probe.py), `--from-run` with
finished runs' measured peaks. Plain arithmetic (training/memory/) but for the probe."""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from training.config import PRESETS, DrafterConfig
from training.contract import EXIT_FAILURE, EXIT_OK, UsageError
from training.drafters.eagle3 import memory
from training.drafters.eagle3.memory import Calibration, GiB, Measurement, StepShape

TABLE_LENGTHS = (4096, 8192, 16384, 24576, 32768, 65536)
TABLE_TTT = (1, 3, 5, 7)
# What --offload-saved costs, as measured (docs/benchmarks.md, "kimi-k2 at TTT 5 under a
# 96 GiB cap"): the copies to and from pinned host memory against the same step without.
OFFLOAD_COST = "the copies cost ~18 % of the throughput (kimi-k2 131,072 × TTT 5, H200)"


def load_drafter_config(args: argparse.Namespace) -> DrafterConfig | None:
    if args.preset is not None:
        if args.preset not in PRESETS:
            raise UsageError(f"--preset must be one of {', '.join(PRESETS)}, got {args.preset!r}")
        return PRESETS[args.preset]
    if args.model_config is not None:
        try:
            data = json.loads(Path(args.model_config).read_text())
            return DrafterConfig.from_dict(data)
        except OSError as e:
            raise UsageError(f"--model-config {args.model_config}: {e.strerror}") from e
        except (json.JSONDecodeError, TypeError, ValueError) as e:
            raise UsageError(f"--model-config {args.model_config}: {e}") from e
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
               "world_size", "sharding", "checkpoint_ttt", "freeze_lm_head", "offload_saved")}
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
    offload = None  # what --offload-saved would make of the step: named if it makes it fit
    if not shape.offload_saved:
        moved = dataclasses.replace(shape, offload_saved=True)
        with_it = memory.predict(cfg, moved, calibration)
        offload = {"peak_gib": with_it.total / GiB,
                   "fits": memory.fits(with_it, args.gpu_mem_gib, args.headroom_gib),
                   "host_gib": sum(memory.host_terms(cfg, moved).values()) / GiB,
                   "largest_max_seq_len": memory.largest_fitting(
                       cfg, shape.ttt_steps, args.gpu_mem_gib, shape=moved,
                       multiple=args.multiple, calibration=calibration,
                       headroom_gib=args.headroom_gib)}
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
        "host_breakdown_bytes": memory.host_terms(cfg, shape),
        "with_offload_saved": offload,
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
    host = r["host_breakdown_bytes"]
    if host:
        lines.append(f"  host: {sum(host.values()) / GiB:.1f} GiB of pinned memory for "
                     "--offload-saved (" + ", ".join(
                         f"{name} {b / GiB:.1f}" for name, b in
                         sorted(host.items(), key=lambda kv: -kv[1]) if b >= GiB // 10) + ")")
    offload = r["with_offload_saved"]
    if not r["fits"]:
        n = r["fewest_checkpoint_ttt"]
        if n is not None:
            lines.append(f"  fits with --checkpoint-ttt {n}")
        elif offload and offload["fits"] and s["checkpoint_ttt"] >= s["ttt_steps"]:
            lines.append(f"  fits with --offload-saved: {offload['peak_gib']:.1f} GiB predicted, "
                         f"{offload['host_gib']:.1f} GiB of pinned host memory; "
                         f"{OFFLOAD_COST}")
        else:
            lines.append("  does not fit even with every TTT step recomputed (--checkpoint-ttt)")
    if offload and offload["largest_max_seq_len"] > largest:
        lines.append(f"  largest that fits with --offload-saved: "
                     f"{offload['largest_max_seq_len']:,}")
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


def fit(args: argparse.Namespace) -> int:
    """The report `trackside fit --drafter eagle3` prints for the flags; the exit code."""
    if args.probe and args.from_run:
        raise UsageError("--probe and --from-run both calibrate: give one")
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
        raise UsageError("give --preset NAME or --model-config PATH (or --from-run RUN_DIR)")
    shape = step_shape(args, base)
    if args.probe:
        from training.drafters.eagle3.probe import ProbeError, run_probe

        try:
            # the probe's steps keep all on the device: its scales serve either way
            calibration = run_probe(cfg, dataclasses.replace(shape, offload_saved=False),
                                    log=None if args.json else print)
        except ProbeError as e:
            print(f"trackside fit: probe failed: {e}", file=sys.stderr)
            return EXIT_FAILURE
    if calibration is not None and args.calibration and (args.probe or args.from_run):
        try:
            calibration.save(args.calibration)
        except OSError as e:
            raise UsageError(f"--calibration {args.calibration}: {e.strerror}") from e
    r = report(cfg, shape, args, calibration)
    print(json.dumps(r, indent=2) if args.json else format_report(r))
    return EXIT_OK
