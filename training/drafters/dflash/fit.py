"""`trackside fit --drafter dflash`: a DFlash step's predicted peak on a card, the largest
max_anchors (at the block size) and block size (at the anchors) that fit, and a table
over both. Plain arithmetic (memory.py): no torch."""
from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from training.config import DFLASH_PRESETS, DFLASH_TRAINING_PRESETS, DFlashConfig
from training.contract import EXIT_OK, UsageError
from training.drafters.dflash import memory as model
from training.drafters.dflash.memory import DFlashShape
from training.memory.peak import fits
from training.memory.units import GiB
from training.params import PARAMS, anchor_room

TABLE_ANCHORS = (256, 512, 1024, 2048, 4096)
TABLE_BLOCKS = (8, 16, 24, 32)
DEFAULT_MAX_SEQ_LEN = 8192


def report(cfg: DFlashConfig, shape: DFlashShape, gpu_mem_gib: float, headroom_gib: float,
           scale: float = 1.0, calibrated_on: dict | None = None) -> dict:
    prediction = model.predict(cfg, shape, scale)
    table = []
    for anchors in sorted({shape.max_anchors, *TABLE_ANCHORS}):
        for block in sorted({cfg.block_size, *TABLE_BLOCKS}):
            if anchors > anchor_room(shape.max_seq_len, block):
                continue
            p = model.predict(dataclasses.replace(cfg, block_size=block),
                              dataclasses.replace(shape, max_anchors=anchors), scale)
            table.append({"max_anchors": anchors, "block_size": block,
                          "peak_gib": p.total / GiB, "reserved_gib": p.reserved / GiB,
                          "fits": fits(p, gpu_mem_gib, headroom_gib)})
    return {
        "drafter": "dflash",
        "config": cfg.to_dict(),
        "shape": dataclasses.asdict(shape),
        "gpu_mem_gib": gpu_mem_gib,
        "headroom_gib": headroom_gib,
        "scale": scale,
        "calibrated_on": calibrated_on,
        "peak_gib": prediction.total / GiB,
        "reserved_gib": prediction.reserved / GiB,
        "peak_phase": prediction.phase,
        "optimizer_step_gib": prediction.optimizer_step / GiB,
        "fits": fits(prediction, gpu_mem_gib, headroom_gib),
        "breakdown_bytes": prediction.breakdown(),
        "largest_max_anchors": model.largest_max_anchors(cfg, shape, gpu_mem_gib,
                                                         scale=scale,
                                                         headroom_gib=headroom_gib),
        "largest_block_size": model.largest_block_size(cfg, shape, gpu_mem_gib, scale=scale,
                                                       headroom_gib=headroom_gib),
        "table": table,
    }


def format_report(r: dict) -> str:
    s, c = r["shape"], r["config"]
    verdict = "fits" if r["fits"] else "will not fit"
    unchunked = s["loss_chunk"] >= s["max_anchors"] * (c["block_size"] - 1) * s["batch_rows"]
    lines = [
        f"DFlash block {c['block_size']} × {s['max_anchors']:,} anchors over "
        f"{s['max_seq_len']:,} tokens: {r['peak_gib']:.1f} GiB predicted "
        f"({r['reserved_gib']:.1f} reserved), card has {r['gpu_mem_gib']:g} GiB — {verdict}",
        f"  largest max_anchors that fits at block {c['block_size']}: "
        f"{r['largest_max_anchors']:,}; largest block size at {s['max_anchors']:,} anchors: "
        f"{r['largest_block_size'] or 'none'}",
        f"  batch rows {s['batch_rows']}, loss chunk "
        f"{'none (the whole loss at once)' if unchunked else s['loss_chunk']}, soft KL "
        f"{s['soft_kl']:g}, {s['precision']}, {s['world_size']} GPU(s) {s['sharding']}, "
        f"{r['headroom_gib']:g} GiB outside the allocator; "
        + (f"scaled ×{r['scale']:.3f} to a measured peak" if r["calibrated_on"]
           else "analytic model"),
        "", f"breakdown (GiB; the step peaks in its {r['peak_phase']} phase):",
    ]
    for name, b in sorted(r["breakdown_bytes"].items(), key=lambda kv: -kv[1]):
        lines.append(f"  {name:<22} {b / GiB:9.3f}")
    blocks = sorted({row["block_size"] for row in r["table"]})
    lines += ["", "predicted peak GiB (* = does not fit):",
              "  max_anchors " + "".join(f"{'block ' + str(b):>11}" for b in blocks)]
    by_anchors: dict[int, dict[int, dict]] = {}
    for row in r["table"]:
        by_anchors.setdefault(row["max_anchors"], {})[row["block_size"]] = row
    for anchors, row in by_anchors.items():
        cells = "".join(f"{row[b]['peak_gib']:10.1f}{' ' if row[b]['fits'] else '*'}"
                        if b in row else f"{'-':>10} " for b in blocks)
        lines.append(f"  {anchors:>11,} {cells}")
    return "\n".join(lines)


def fit(args: argparse.Namespace) -> int:
    """The report `trackside fit --drafter dflash` prints for the flags, the preset or
    config, and the run of --from-run (whose measured peak scales the prediction); the
    exit code."""

    cfg, base, scale, calibrated_on, knobs = None, None, 1.0, None, {}
    if args.from_run:
        if len(args.from_run) > 1:
            raise UsageError("--from-run: a DFlash prediction is scaled to one run's peak")
        try:
            cfg, base, peak = model.dflash_from_run(args.from_run[0])
            scale = model.calibrate(cfg, base, peak)
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
    length = pick("max_seq_len", DEFAULT_MAX_SEQ_LEN)
    if cfg.block_size > length:
        raise UsageError(f"--block-size {cfg.block_size} exceeds the row's {length} tokens")
    room = anchor_room(length, cfg.block_size)
    anchors = pick("max_anchors", min(PARAMS["max_anchors"].default, room))
    if anchors > room:
        raise UsageError(f"--max-anchors {anchors}: a row of max_seq_len {length} holds at "
                         f"most {room} blocks of {cfg.block_size} tokens")
    try:
        shape = DFlashShape(
            max_seq_len=length, max_anchors=anchors, soft_kl=pick("soft_kl", PARAMS["soft_kl"].default),
            batch_rows=pick("batch_rows", 1), loss_chunk=pick("loss_chunk", 2048),
            precision=pick("precision", "bf16"), world_size=pick("world_size", 1),
            sharding=pick("sharding", "ddp"))
    except ValueError as e:
        raise UsageError(str(e)) from e
    r = report(cfg, shape, args.gpu_mem_gib, args.headroom_gib, scale, calibrated_on)
    print(json.dumps(r, indent=2) if args.json else format_report(r))
    return EXIT_OK
