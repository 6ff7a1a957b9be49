"""`trackside fit`: predicted peak memory of a training step, and the largest max_seq_len
(EAGLE-3) or max_anchors and block size (DFlash, training/drafters/dflash/fit.py) that fit a card;
`--probe` calibrates the EAGLE-3 prediction with a few real steps on this GPU
(training/probe.py), `--from-run` with a finished run's measured peak.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path

from training import memory
from training.config import DFLASH_PRESETS, PRESETS, DFlashConfig, DrafterConfig
from training.contract import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, OneLineParser, UsageError
from training.memory import Calibration, GiB, Measurement, StepShape
from training.params import PARAMS, add_param_flag, anchor_room

TABLE_LENGTHS = (4096, 8192, 16384, 24576, 32768, 65536)
TABLE_TTT = (1, 3, 5, 7)
# What --offload-saved costs, as measured (docs/benchmarks.md, "kimi-k2 at TTT 5 under a
# 96 GiB cap"): the copies to and from pinned host memory against the same step without.
OFFLOAD_COST = "the copies cost ~18 % of the throughput (kimi-k2 131,072 × TTT 5, H200)"


def _positive_int(flag: str, value: int | None) -> None:
    if value is not None and value <= 0:
        raise UsageError(f"{flag} must be a positive integer, got {value}")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = OneLineParser(
        prog="trackside fit",
        description="Predict the peak GPU memory of a training step and the largest "
                    "max_seq_len that fits.")
    p.add_argument("--drafter", choices=["eagle3", "dflash"], default="eagle3")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--model-config", metavar="PATH", help="drafter config JSON "
                     "(DrafterConfig fields, or DFlashConfig's with --drafter dflash), as "
                     "train --model-config")
    src.add_argument("--preset", help=f"built-in drafter shape: {', '.join(PRESETS)}; "
                     f"DFlash: {', '.join(DFLASH_PRESETS)}")
    p.add_argument("--gpu-mem-gib", type=float, default=96.0,
                   help="memory of one GPU (default 96)")
    # the trainer's flags take the trainer's ranges (training/params.py)
    add_param_flag(p, "max_seq_len", help="tokens per packed row (default: the run's with "
                   "--from-run, else 16384)")
    add_param_flag(p, "ttt_steps", help="TTT depth (default: the run's, else 5)")
    add_param_flag(p, "batch_rows", help="rows per step and GPU (default 1)")
    add_param_flag(p, "loss_chunk", help="positions per loss chunk (default 2048)")
    p.add_argument("--precision", choices=tuple(memory.PRECISIONS), default=None,
                   help="bf16 autocast (GPU default) or fp32")
    p.add_argument("--world-size", type=int, help="GPUs in the run (default 1)")
    p.add_argument("--sharding", choices=memory.SHARDINGS, default=None,
                   help="as train --sharding: ddp (every GPU holds the whole drafter and "
                        "its AdamW state) or fsdp (each holds a shard of them and gathers "
                        "the weights it runs whole); default: the run's, else ddp")
    add_param_flag(p, "checkpoint_ttt", metavar="N", help="as train --checkpoint-ttt: the "
                   "first N TTT steps recomputed in backward (bare: every step)")
    add_param_flag(p, "freeze_lm_head", default=None,
                   help="as train --freeze-lm-head: the draft head takes no gradient")
    p.add_argument("--offload-saved", action="store_true", default=None,
                   help="as train --offload-saved: what backward keeps, and AdamW's state "
                        "between steps, in pinned host memory (counted on a host line)")
    p.add_argument("--multiple", type=int, default=1024,
                   help="round the largest max_seq_len down to a multiple of this")
    p.add_argument("--headroom-gib", type=float,
                   help="memory outside the allocator: CUDA context, NCCL (default "
                        f"{memory.DEFAULT_HEADROOM_GIB:g})")
    # Every other command's --config is the hosts file: here, only a pointer to the flag meant.
    p.add_argument("--config", dest="hosts_config", help=argparse.SUPPRESS)
    p.add_argument("--calibration", help="calibration JSON (from --probe); with --probe or "
                   "--from-run, where the new calibration is written")
    p.add_argument("--from-run", action="append", metavar="RUN_DIR",
                   help="re-calibrate from a finished run's metrics.jsonl; repeat for "
                        "several runs of one drafter (more shapes, a better fit)")
    p.add_argument("--probe", action="store_true",
                   help="calibrate with a few real steps on this machine's GPU")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    dflash = p.add_argument_group("DFlash (--drafter dflash)")
    add_param_flag(dflash, "max_anchors", help="blocks per packed row (default: the run's, "
                   f"the preset's, else {PARAMS['max_anchors'].default})")
    add_param_flag(dflash, "block_size", help="default: the run's or the preset's")
    add_param_flag(dflash, "soft_kl", help="default: the run's, the preset's, else "
                   f"{PARAMS['soft_kl'].default:g}")
    args = p.parse_args(argv)
    for flag in ("world_size", "multiple"):  # fit's own
        _positive_int("--" + flag.replace("_", "-"), getattr(args, flag))
    if not args.gpu_mem_gib > 0 or not math.isfinite(args.gpu_mem_gib):
        raise UsageError(f"--gpu-mem-gib must be positive, got {args.gpu_mem_gib}")
    if args.hosts_config is not None:
        raise UsageError("--config is the hosts file of trackside's other commands: the "
                         "drafter's JSON is --model-config PATH")
    # Named as given: a card too small for the default headroom is the card's flag.
    given_headroom = args.headroom_gib is not None
    if not given_headroom:
        args.headroom_gib = memory.DEFAULT_HEADROOM_GIB
    if not args.headroom_gib >= 0:
        raise UsageError(f"--headroom-gib must be 0 or more, got {args.headroom_gib:g}")
    if args.headroom_gib >= args.gpu_mem_gib:
        raise UsageError(
            f"--headroom-gib {args.headroom_gib:g} leaves nothing of --gpu-mem-gib {args.gpu_mem_gib:g}"
            if given_headroom else
            f"--gpu-mem-gib {args.gpu_mem_gib:g} leaves nothing beside the {args.headroom_gib:g} GiB of "
            "--headroom-gib (CUDA context, NCCL)")
    if args.probe and args.from_run:
        raise UsageError("--probe and --from-run both calibrate: give one")
    one = _EAGLE3_ONLY if args.drafter == "dflash" else _DFLASH_ONLY
    given = ["--" + d.replace("_", "-") for d in one if getattr(args, d) not in (None, False)]
    if given:
        raise UsageError(f"{', '.join(given)}: not for --drafter {args.drafter}")
    return args


# Flags of one drafter's fit that the other's would silently ignore.
_EAGLE3_ONLY = ("ttt_steps", "checkpoint_ttt", "freeze_lm_head", "offload_saved", "probe",
                "calibration")
_DFLASH_ONLY = ("max_anchors", "block_size", "soft_kl")
DFLASH_MAX_SEQ_LEN = 8192


def dflash_fit(args: argparse.Namespace) -> dict:
    """The DFlash report (training/drafters/dflash/fit.py) for the flags, the preset or config, and
    the run of --from-run (whose measured peak scales the prediction)."""
    from training.config import DFLASH_TRAINING_PRESETS
    from training.drafters.dflash.fit import report
    from training.memory import dflash as dflash_memory

    cfg, base, scale, calibrated_on, knobs = None, None, 1.0, None, {}
    if args.from_run:
        if len(args.from_run) > 1:
            raise UsageError("--from-run: a DFlash prediction is scaled to one run's peak")
        try:
            cfg, base, peak = memory.dflash_from_run(args.from_run[0])
            scale = dflash_memory.calibrate(cfg, base, peak)
        except ValueError as e:
            raise UsageError(f"--from-run {args.from_run[0]}: {e}") from e
        calibrated_on = {"run": args.from_run[0], "peak_gib": peak / GiB,
                         "shape": dataclasses.asdict(base)}
    if args.preset is not None:
        if args.preset not in DFLASH_PRESETS:
            raise UsageError(f"--preset must be one of {', '.join(DFLASH_PRESETS)} with "
                             f"--drafter dflash, got {args.preset!r}")
        cfg, knobs = DFLASH_PRESETS[args.preset], DFLASH_TRAINING_PRESETS.get(args.preset, {})
    elif args.model_config is not None:
        try:
            cfg = DFlashConfig.from_dict(json.loads(Path(args.model_config).read_text()))
        except OSError as e:
            raise UsageError(f"--model-config {args.model_config}: {e.strerror}") from e
        except (json.JSONDecodeError, TypeError, ValueError) as e:
            raise UsageError(f"--model-config {args.model_config}: {e}") from e
    if cfg is None:
        raise UsageError("give --preset NAME or --model-config PATH (or --from-run RUN_DIR)")
    if args.block_size:
        cfg = dataclasses.replace(cfg, block_size=args.block_size)

    def pick(flag: str, fallback):
        given = getattr(args, flag)
        return given if given is not None else getattr(base, flag) if base else \
            knobs.get(flag, fallback)
    length = pick("max_seq_len", DFLASH_MAX_SEQ_LEN)
    if cfg.block_size > length:
        raise UsageError(f"--block-size {cfg.block_size} exceeds the row's {length} tokens")
    room = anchor_room(length, cfg.block_size)
    anchors = pick("max_anchors", min(PARAMS["max_anchors"].default, room))
    if anchors > room:
        raise UsageError(f"--max-anchors {anchors}: a row of max_seq_len {length} holds at "
                         f"most {room} blocks of {cfg.block_size} tokens")
    try:
        shape = memory.DFlashShape(
            max_seq_len=length, max_anchors=anchors, soft_kl=pick("soft_kl", PARAMS["soft_kl"].default),
            batch_rows=pick("batch_rows", 1), loss_chunk=pick("loss_chunk", 2048),
            precision=pick("precision", "bf16"), world_size=pick("world_size", 1),
            sharding=pick("sharding", "ddp"))
    except ValueError as e:
        raise UsageError(str(e)) from e
    return report(cfg, shape, args.gpu_mem_gib, args.headroom_gib, scale, calibrated_on)


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


def main(argv: list[str]) -> int:
    argv = argv[1:] if argv and argv[0] == "fit" else argv
    try:
        args = parse_args(argv)
        if args.drafter == "dflash":
            from training.drafters.dflash.fit import format_report as format_dflash

            r = dflash_fit(args)
            print(json.dumps(r, indent=2) if args.json else format_dflash(r))
            return EXIT_OK
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
            from training.probe import ProbeError, run_probe

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
    except UsageError as e:
        if str(e):
            print(f"trackside fit: {e}", file=sys.stderr)
        return EXIT_USAGE
    r = report(cfg, shape, args, calibration)
    print(json.dumps(r, indent=2) if args.json else format_report(r))
    return EXIT_OK


