"""Launch to first completed step: `trackside train` started fresh at max_seq_len values
it has not run before, as a relaunch with an edited max_seq_len is.

Each launch is a new process (python -m training train) on a random data directory of
the preset's shape (bench/random_data.py); the time is from just before the process is
started to the `time` of its first `step` event in metrics.jsonl, so process start,
imports, data loading, model set-up, compilation and the step itself all count. The
first length warms whatever caches persist on disk (as the run before a relaunch
would; it is labelled cold only when inductor's cache held nothing before it); the later
ones are new lengths.

    python bench/first_step.py                            # H200: llama3-8b, TTT 5
    python bench/first_step.py --preset tiny --lengths 256 384 --device cpu   # smoke

--profile runs the named lengths under cProfile (slower: for where the time goes, not
for the figure) and keeps each one's profile and its cumulative and own-time tops in
$OUT.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from bench import random_data  # noqa: E402


def launch(data: Path, run_dir: Path, preset: str, max_seq_len: int, ttt: int,
           device: str, timeout: float, profile: Path | None = None) -> dict:
    python = [sys.executable] + (["-m", "cProfile", "-o", str(profile)] if profile else [])
    cmd = python + ["-m", "training", "train", "--data", str(data), "--out",
           str(run_dir), "--preset", preset, "--max-seq-len", str(max_seq_len),
           "--ttt-steps", str(ttt), "--steps", "1", "--device", device, "--save-every", "0"]
    started = time.time()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    if os.environ.get("OUT"):  # e.g. run with TORCH_LOGS=recompiles: what was compiled
        Path(os.environ["OUT"], f"first_step_{max_seq_len}.log").write_text(
            proc.stdout + proc.stderr)
    events = {}
    metrics = run_dir / "metrics.jsonl"
    for line in metrics.read_text().splitlines() if metrics.exists() else []:
        event = json.loads(line)
        events.setdefault(event["event"], event)
    row = {"max_seq_len": max_seq_len, "exit": proc.returncode,
           "wall_s": time.time() - started}
    if "start" in events:
        row["start_event_s"] = events["start"]["time"] - started
    if "step" in events:
        row["first_step_s"] = events["step"]["time"] - started
    else:
        row["error"] = (proc.stderr.strip().splitlines() or ["no step event"])[-1]
    return row


def without_torch_bytecode() -> bool:
    """True when each launch compiles torch's Python from source: no bytecode beside it
    and none written (PYTHONDONTWRITEBYTECODE). A pip-installed torch has its bytecode; the
    lent H200 machine's image had none and set the flag, ~6 s of every launch there."""
    return (sys.flags.dont_write_bytecode
            and not Path(importlib.util.cache_from_source(torch.__file__)).exists())


def inductor_cache_is_empty() -> bool:
    """No compiled kernels on disk yet (TORCHINDUCTOR_CACHE_DIR or its default): the first
    launch compiles cold. Otherwise an earlier process left kernels the first may reuse."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir
    root = Path(cache_dir())
    return not (root.is_dir() and any(root.iterdir()))


def write_profile(profile: Path, text: Path) -> None:
    if not profile.exists():
        return
    with text.open("w") as f:
        stats = pstats.Stats(str(profile), stream=f)
        stats.sort_stats("cumulative").print_stats(80)
        stats.sort_stats("tottime").print_stats(40)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="llama3-8b")
    p.add_argument("--lengths", type=int, nargs="+", default=[8192, 12288, 20480, 16384])
    p.add_argument("--ttt-steps", type=int, default=5)
    p.add_argument("--device", default="cuda")
    p.add_argument("--samples", type=int, default=24)
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--profile", type=int, nargs="*", default=[], metavar="MAX_SEQ_LEN")
    args = p.parse_args(argv)
    out = Path(os.environ.get("OUT", "."))
    if without_torch_bytecode():
        print("first_step: torch has no bytecode and PYTHONDONTWRITEBYTECODE is set: every "
              "launch below compiles torch's modules from source (python -m compileall on "
              "torch's directory first measures what a pip install sees)", file=sys.stderr)
    rows = []
    first = "cold" if inductor_cache_is_empty() else "earlier kernels on disk"
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp, "data")
        random_data.make(args.preset, data, args.samples, 2048)
        for i, length in enumerate(args.lengths):
            profile = out / f"first_step_{length}.prof" if length in args.profile else None
            row = launch(data, Path(tmp, f"run{i}"), args.preset, length, args.ttt_steps,
                         args.device, args.timeout, profile)
            row["cache"] = first if i == 0 else "new length"
            if profile is not None:
                row["profiled"] = True
                write_profile(profile, profile.with_suffix(".prof.txt"))
            rows.append(row)
            print(json.dumps(row), flush=True)
    print("\n| max_seq_len | disk caches | start event s | first step s | exit |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        first = f"{r['first_step_s']:.1f}" if "first_step_s" in r else r.get("error", "")
        start = f"{r['start_event_s']:.1f}" if "start_event_s" in r else ""
        print(f"| {r['max_seq_len']} | {r['cache']} | {start} | {first} | {r['exit']} |")
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "first_step.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
