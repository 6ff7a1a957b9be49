"""`trackside fit`: predicted peak memory of a training step, and the largest step that fits
a card: the flags every drafter's report reads, each drafter's own (training/drafters/),
and the report of the drafter --drafter names (its folder's fit.py: EAGLE-3's largest
max_seq_len, `--probe` and `--from-run` calibrations; DFlash's largest max_anchors and
block size).
"""
from __future__ import annotations

import argparse
import math
import sys

from training import drafters
from training.contract import EXIT_USAGE, OneLineParser, UsageError
from training.memory.peak import DEFAULT_HEADROOM_GIB
from training.memory.state import SHARDINGS
from training.memory.units import PRECISIONS
from training.params import add_param_flag


def _positive_int(flag: str, value: int | None) -> None:
    if value is not None and value <= 0:
        raise UsageError(f"{flag} must be a positive integer, got {value}")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = OneLineParser(
        prog="trackside fit",
        description="Predict the peak GPU memory of a training step and the largest "
                    "max_seq_len that fits.")
    p.add_argument("--drafter", choices=list(drafters.DRAFTERS), default=drafters.DEFAULT)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--model-config", metavar="PATH", help="drafter config JSON "
                     "(DrafterConfig fields, or DFlashConfig's with --drafter dflash), as "
                     "train --model-config")
    src.add_argument("--preset", help="built-in drafter shape: " + drafters.presets_help())
    p.add_argument("--gpu-mem-gib", type=float, default=96.0,
                   help="memory of one GPU (default 96)")
    # the trainer's flags take the trainer's ranges (training/params.py)
    add_param_flag(p, "max_seq_len", help="tokens per packed row (default: the run's with "
                   "--from-run, else 16384)")
    add_param_flag(p, "batch_rows", help="rows per step and GPU (default 1)")
    add_param_flag(p, "loss_chunk", help="positions per loss chunk (default 2048)")
    p.add_argument("--precision", choices=tuple(PRECISIONS), default=None,
                   help="bf16 autocast (GPU default) or fp32")
    p.add_argument("--world-size", type=int, help="GPUs in the run (default 1)")
    p.add_argument("--sharding", choices=SHARDINGS, default=None,
                   help="as train --sharding: ddp (every GPU holds the whole drafter and "
                        "its AdamW state) or fsdp (each holds a shard of them and gathers "
                        "the weights it runs whole); default: the run's, else ddp")
    p.add_argument("--multiple", type=int, default=1024,
                   help="round the largest max_seq_len down to a multiple of this")
    p.add_argument("--headroom-gib", type=float,
                   help="memory outside the allocator: CUDA context, NCCL (default "
                        f"{DEFAULT_HEADROOM_GIB:g})")
    # Every other command's --config is the hosts file: here, only a pointer to the flag meant.
    p.add_argument("--config", dest="hosts_config", help=argparse.SUPPRESS)
    p.add_argument("--from-run", action="append", metavar="RUN_DIR",
                   help="re-calibrate from a finished run's metrics.jsonl; repeat for "
                        "several runs of one drafter (more shapes, a better fit)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    drafters.add_flags(p, "fit")
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
        args.headroom_gib = DEFAULT_HEADROOM_GIB
    if not args.headroom_gib >= 0:
        raise UsageError(f"--headroom-gib must be 0 or more, got {args.headroom_gib:g}")
    if args.headroom_gib >= args.gpu_mem_gib:
        raise UsageError(
            f"--headroom-gib {args.headroom_gib:g} leaves nothing of --gpu-mem-gib {args.gpu_mem_gib:g}"
            if given_headroom else
            f"--gpu-mem-gib {args.gpu_mem_gib:g} leaves nothing beside the {args.headroom_gib:g} GiB of "
            "--headroom-gib (CUDA context, NCCL)")
    foreign = drafters.foreign_flags(args, "fit")
    if foreign:
        raise UsageError(f"{', '.join(foreign[1])}: not for --drafter {args.drafter}")
    return args


def main(argv: list[str]) -> int:
    argv = argv[1:] if argv and argv[0] == "fit" else argv
    try:
        args = parse_args(argv)
        return drafters.DRAFTERS[args.drafter].fit(args)
    except UsageError as e:
        if str(e):
            print(f"trackside fit: {e}", file=sys.stderr)
        return EXIT_USAGE
