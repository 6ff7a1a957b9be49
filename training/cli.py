"""`trackside train|extract|fit`: parse, validate (exit 2 naming the flag), run.

argv includes the subcommand as argv[0], as tui/cli.py hands it over.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import NoReturn

from training import contract, drafters, register
from training.bytecode import keep_bytecode
from training.contract import EXIT_OK, EXIT_USAGE, OneLineParser, UsageError
from training.memory.state import SHARDINGS
from training.params import EXCLUSIVE, add_param_flag, layer_list


def _typed(kind, check, what: str):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not check(value):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value
    return parse


# For the flags outside training/params.py's table (those a relaunch does not change).
POSITIVE_INT = _typed(int, lambda v: v > 0, "a positive integer")
POSITIVE_FLOAT = _typed(float, lambda v: v > 0 and v != float("inf"), "a positive number")


def runs_root() -> Path:
    return Path(contract.local_runs_root()).expanduser()


def _pids(text: str) -> tuple[int, ...]:
    try:
        pids = tuple(int(p) for p in text.split(",") if p)
    except ValueError:
        pids = ()
    if not pids or min(pids) < 1:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of PIDs: {text!r}")
    return pids


def train_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="trackside train",
                                description="Train an EAGLE-3 or DFlash drafter on hidden "
                                            "states.")
    p.add_argument("--drafter", choices=list(drafters.DRAFTERS), default=drafters.DEFAULT)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--synthetic", action="store_true",
                        help="a tiny verifier and data set made on the fly (cached)")
    source.add_argument("--data", type=Path, help="a data directory from trackside extract")
    p.add_argument("--out", type=Path, help="run directory (default: a new one under "
                   "$TRACKSIDE_RUNS_ROOT or ~/.trackside/runs)")
    add_param_flag(p, "max_seq_len", help="tokens per packed row (default 2048; 512 with --synthetic)")
    [(steps, epochs)] = EXCLUSIVE
    length = p.add_mutually_exclusive_group()
    add_param_flag(length, steps)
    add_param_flag(length, epochs, help="default 1 when --steps is absent")
    add_param_flag(p, "lr", help="peak learning rate (default 1e-4; 3e-3 with --synthetic)")
    add_param_flag(p, "batch_rows", default=1, help="packed rows per process per step")
    shape = p.add_mutually_exclusive_group()
    shape.add_argument("--model-config", type=Path, help="drafter shape as JSON")
    shape.add_argument("--preset", choices=sorted({name for spec in drafters.DRAFTERS.values()
                                                   for name in spec.presets}),
                       help="default tiny; " + drafters.presets_help())
    p.add_argument("--device", choices=["cpu", "cuda"])
    p.add_argument("--sharding", choices=SHARDINGS, default="ddp",
                   help="ddp (default): every process holds the whole drafter; fsdp: "
                        "its trained weights, gradients and AdamW state sharded over the "
                        "processes, for a drafter whose optimizer state crowds a card")
    p.add_argument("--resume", action="store_true",
                   help="continue from the newest checkpoint in --out")
    p.add_argument("--resume-from", type=Path, metavar="CHECKPOINTS",
                   help="start from the newest checkpoint in another run's checkpoints "
                        "directory (a relaunch's parent's), once its writer is done")
    p.add_argument("--after-pids", type=_pids, default=(), metavar="PID,...",
                   help="start once these processes have ended (the run a relaunch replaces, "
                        "still stopping): the imports first, the device after")
    add_param_flag(p, "loss_chunk", default=2048)
    p.add_argument("--gpu-mem-gib", type=POSITIVE_FLOAT,
                   help="cap this process's GPU memory (a smaller card, for tests)")
    add_param_flag(p, "save_every", default=1000,
                   help="checkpoint every N steps (0: only at the end or when stopped)")
    add_param_flag(p, "seed", default=0)
    p.add_argument("--max-nonfinite", type=POSITIVE_INT, default=contract.MAX_NONFINITE,
                   metavar="N", help="a step whose loss or gradient is not finite is skipped, "
                   "never applied; stop after N in a row (exit 4; default %(default)s)")
    p.add_argument("--export", type=Path, help="export the final drafter here")
    add_param_flag(p, "fp8",
                   help="the layers' projections, and the gradient through a frozen head, in fp8 with "
                        "per-tensor scaling (H100/H200 and newer)")
    drafters.add_flags(p, "train")
    return p


def _run_dir(args, device: str) -> Path:
    if args.out is None:
        if args.resume:
            raise UsageError("--resume needs --out RUN_DIR")
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # set by torchrun
            raise UsageError("under torchrun every rank must write to one run directory: "
                             "pass --out RUN_DIR")
        return runs_root() / contract.new_run_id()
    if not args.resume and _holds_a_run(args.out, device):
        said = (f"--out {args.out} already holds a run; pass --resume or choose another "
                "directory")
        # Every rank refuses; rank 0 alone says why, once for the whole run.
        raise UsageError(said if int(os.environ.get("RANK", "0")) == 0 else "")
    return args.out


def _holds_a_run(out: Path, device: str) -> bool:
    """Whether `out` holds a run, as rank 0 sees it before any rank has written.

    Under torchrun rank 0 alone looks, and the process group carries its answer to every
    rank: a rank looking for itself could look after rank 0 had begun this very run, and
    refuse it."""
    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        return (out / "metrics.jsonl").exists()
    import torch.distributed as dist

    from training.distributed import join_processes

    join_processes(device)
    seen = [(out / "metrics.jsonl").exists() if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(seen, src=0)
    return seen[0]


def train_main(argv: list[str]) -> int:
    args = train_parser().parse_args(argv)
    if args.resume and args.resume_from:
        raise UsageError("--resume continues this run, --resume-from starts from another's: give one")
    import torch

    from training.distributed import leave_processes

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is available")
    if args.gpu_mem_gib and device != "cuda":
        raise UsageError("--gpu-mem-gib needs --device cuda")
    try:
        return _train(args, device, argv)
    except UsageError:
        leave_processes()  # where a rank joined its torchrun run before refusing
        raise


def _train(args, device: str, argv: list[str]) -> int:
    from training.data import Dataset, DatasetError
    from training.handover import StillRunning, wait_for_exit
    from training.loop import TrainConfig, train
    from training.resume import ResumeError

    if device == "cuda":
        from training import compile_cache
        from training.compiled import import_compiler_meanwhile

        import_compiler_meanwhile()
        compile_cache.load_meanwhile(runs_root())
    replaced_run_s = None
    if args.after_pids:  # before anything joins torchrun's processes, which takes the GPU
        print(f"train: waiting for the run this replaces (PIDs {', '.join(map(str, args.after_pids))}) "
              "to end", flush=True)
        try:
            replaced_run_s = wait_for_exit(args.after_pids)
        except StillRunning as still:
            print(f"train: {still}", file=sys.stderr, flush=True)
            return contract.EXIT_FAILURE
    run_dir = _run_dir(args, device)
    if args.synthetic:
        from training.synthetic import synthetic_dataset

        data = synthetic_dataset(args.seed)
    else:
        data = args.data
    try:
        dataset = Dataset(data)
    except DatasetError as exc:
        raise UsageError(f"--data: {exc}") from None
    max_seq_len = args.max_seq_len or (512 if args.synthetic else 2048)
    spec = drafters.DRAFTERS[args.drafter]
    foreign = drafters.foreign_flags(args, "train")
    if foreign:
        owner, given = foreign
        raise UsageError(f"{given[0]} needs --drafter {owner.name}"
                         if args.drafter == drafters.DEFAULT else
                         f"{', '.join(given)}: {owner.title}'s, not for --drafter {args.drafter}")
    cfg = TrainConfig(
        data=Path(data), run_dir=run_dir, **spec.from_flags(args, dataset, max_seq_len),
        steps=args.steps, epochs=None if args.steps else (args.epochs or 1),
        max_seq_len=max_seq_len,
        lr=args.lr or (3e-3 if args.synthetic else 1e-4), batch_rows=args.batch_rows,
        device=device, resume=args.resume, resume_from=args.resume_from, replaced_run_s=replaced_run_s,
        loss_chunk=args.loss_chunk, sharding=args.sharding,
        gpu_mem_gib=args.gpu_mem_gib, save_every=args.save_every, seed=args.seed,
        max_nonfinite=args.max_nonfinite, fp8=args.fp8,
        export=None if spec.exports_after_run else args.export)
    if cfg.fp8:
        import torch

        from training.fp8 import refusal

        said = refusal(torch.cuda.get_device_capability() if device == "cuda" else None,
                       cfg.drafter)
        if said:
            raise UsageError(f"--fp8: {said}")
    run_dir.mkdir(parents=True, exist_ok=True)
    if args.synthetic:
        # Every rank of a torchrun run gets here: each links under its own name and renames
        # that over `data`, which cannot collide (checking for the link, then making it, let
        # two ranks race and one fail) and also mends a stale link.
        link = run_dir / f".data-{os.getpid()}"
        link.unlink(missing_ok=True)
        link.symlink_to(Path(data).resolve())
        os.replace(link, run_dir / "data")
    # Typed by hand in a tmux pane: a run like a launched one (training/register.py).
    registered = int(os.environ.get("WORLD_SIZE", "1")) == 1 and register.register(run_dir, ["train", *argv], runs_root())
    code = contract.EXIT_FAILURE  # what an exception out of the loop exits with
    try:
        code = train(cfg)
    except (DatasetError, ResumeError) as exc:
        code = EXIT_USAGE
        flag = ("--resume-from" if args.resume_from else "--resume") if isinstance(exc, ResumeError) \
            else "--batch-rows/--max-seq-len"
        raise UsageError(f"{flag}: {exc}") from None
    except KeyboardInterrupt:
        code = 130  # as a shell reports ^C
        raise
    finally:
        if registered:
            register.ended(run_dir, code)
    if code == 0 and spec.exports_after_run and args.export and int(os.environ.get("RANK", "0")) == 0:
        from training import checkpoint, durable

        durable.wait_for_writer(run_dir / "checkpoints",
                                lambda said: print(f"train: --export: {said}", flush=True))

        spec.export(checkpoint.latest(run_dir / "checkpoints"), args.export,
                    dataset.info.get("model") or None)
    return code


def extract_main(argv: list[str]) -> int:
    p = OneLineParser(prog="trackside extract",
                                description="Capture a causal LM's hidden states into a "
                                            "data directory.")
    p.add_argument("--model", required=True,
                   help="model directory or hub id, or a config.json (random weights)")
    p.add_argument("--prompts", required=True, type=Path, help="JSONL samples")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--drafter", choices=list(drafters.DRAFTERS), default=drafters.DEFAULT,
                   help="whose default layers to capture: EAGLE-3's three (2, n/2, n-3) or "
                        "DFlash's five, spread from layer 1 to n-3")
    p.add_argument("--layers", type=layer_list,
                   help="capture these layers a,b,… instead of the drafter's default")
    p.add_argument("--max-tokens-per-batch", type=POSITIVE_INT, default=16384)
    args = p.parse_args(argv)
    from training.extract import ExtractError, run

    try:
        info = run(args.model, args.prompts, args.out, args.layers,
                   args.max_tokens_per_batch, args.drafter)
    except ExtractError as exc:
        raise UsageError(f"{exc.flag}: {exc}") from None
    print(f"extract: wrote {info['num_samples']} samples, {info['total_tokens']} tokens, "
          f"layers {info['layers']} to {args.out}", flush=True)
    return EXIT_OK


def exit_process(code: int) -> NoReturn:
    """End the trainer's process now that everything it writes is written: the
    interpreter's own teardown with torch loaded (its modules, atexit handlers, inductor's
    compile workers) took 0.5-0.8 s, which a stopped run's GPU waited out, as the device is
    freed only when the process is gone. Under a profiler (`python -m cProfile -o …`),
    which writes its file at the normal exit, the normal exit."""
    monitoring = getattr(sys, "monitoring", None)  # where Python 3.12's cProfile hooks in
    if sys.getprofile() is not None or (
            monitoring is not None and monitoring.get_tool(monitoring.PROFILER_ID) is not None):
        sys.exit(code)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command, rest = (argv[0], argv[1:]) if argv else ("", [])
    keep_bytecode()  # before torch is imported
    try:
        if command == "train":
            return train_main(rest)
        if command == "extract":
            return extract_main(rest)
        if command == "fit":
            from training.fit import main as fit_main

            return fit_main(argv)
    except UsageError as exc:
        if str(exc):
            print(f"trackside {command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print("usage: trackside {train,extract,fit} …", file=sys.stderr)
    return EXIT_USAGE
