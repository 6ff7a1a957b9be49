"""A fresh box's first step, with and without compiled artifacts shipped with the code
(training/compile_cache.py).

Each launch runs `python3 -m training train` with every cache of its own and empty
(inductor's, Triton's, the trainer's bytecode under PYTHONDONTWRITEBYTECODE images, a new
runs root): what a box that never ran trackside has. The first launch of a drafter keeps
its artifacts under its runs root; they are then copied into the package's
`training/compiled/`, as `--ship` would carry them, and a second launch, its caches
empty again, reads them from there. A third gets the first launch's Triton cache too, to
say what trackside's own Triton kernels (not in torch's artifacts) cost to compile. The
sets the tree ships are moved aside meanwhile, so the first launch is cold, and put back.
With $OUT set, the kept sets go there as compiled-DRAFTER.tgz, to be committed into the package.

    PYTHONPATH=$PWD python3 bench/fresh_box.py                    # both drafters, on the GPU
    .venv/bin/python bench/fresh_box.py --smoke --drafters eagle3  # the flow on the CPU, tiny

Times are from the process's start (the start event's `process_started`) to its start
event and to its first step event. Prints one JSON document; with $OUT set, writes it there too.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from training.compile_cache import PACKAGE_FOLDER, SUFFIX

REPO = Path(__file__).resolve().parent.parent
# The tree's own sets while the bench runs: beside the package's folder, so a rename on the
# same filesystem, and put back at the start of a run that finds them (one cut short).
ASIDE = PACKAGE_FOLDER.with_name(".compiled-aside")

CELLS = {  # (preset, the run's flags, random_data's flags)
    ("eagle3", False): ("llama3-8b", ["--max-seq-len", "8192", "--ttt-steps", "5"], ["--samples", "40", "--length", "2048"]),
    ("dflash", False): ("qwen3-8b", ["--drafter", "dflash", "--max-seq-len", "8192", "--block-size", "16",
                                     "--max-anchors", "512"], []),
    ("eagle3", True): ("tiny", ["--max-seq-len", "256", "--ttt-steps", "2"], []),
    ("dflash", True): ("tiny", ["--drafter", "dflash", "--max-seq-len", "256", "--block-size", "4",
                                "--max-anchors", "8"], []),
}


def launch(work: Path, label: str, data: Path, preset: str, flags: list[str], device: str,
           triton_cache: Path | None = None) -> dict:
    """One trainer with caches of its own, stopped after its first step's event."""
    caches = work / label
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(caches / "inductor"),
           "TRITON_CACHE_DIR": str(triton_cache or caches / "triton"),
           "TRACKSIDE_PYCACHE": str(caches / "pycache"), "TRACKSIDE_RUNS_ROOT": str(caches / "runs"),
           "PYTHONPATH": str(REPO)}
    run_dir = caches / "run"
    command = [sys.executable, "-m", "training", "train", "--data", str(data), "--preset", preset, *flags,
               "--steps", "2", "--save-every", "0", "--device", device, "--out", str(run_dir)]
    began = time.time()
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode:
        raise SystemExit(f"{label}: exited {done.returncode}: {done.stderr[-1500:]}")
    seen = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    start = next(e for e in seen if e["event"] == "start")
    step = next(e for e in seen if e["event"] == "step")
    said = [line for line in done.stdout.splitlines() if "compiled artifacts" in line]
    return {"start_event_s": round(start["time"] - start["process_started"], 2),
            "first_step_s": round(step["time"] - start["process_started"], 2),
            "startup_s": start["startup_s"], "process_to_exit_s": round(time.time() - began, 2),
            "compiled_artifacts": said}


def fresh_box(drafter: str, smoke: bool, work: Path) -> dict:
    preset, flags, data_flags = CELLS[(drafter, smoke)]
    device = "cpu" if smoke else "cuda"
    data = work / f"data-{drafter}"
    subprocess.run([sys.executable, "bench/random_data.py", "--drafter", drafter, "--preset", preset,
                    "--out", str(data), *data_flags], cwd=REPO, check=True, capture_output=True, timeout=300)
    out = {"cold": launch(work, f"{drafter}-cold", data, preset, flags, device)}
    kept = work / f"{drafter}-cold" / "runs" / "compiled"
    if kept.exists():
        shutil.copytree(kept, PACKAGE_FOLDER, dirs_exist_ok=True)
        if os.environ.get("OUT"):  # one file: a target's name has characters a device copy refuses
            with tarfile.open(Path(os.environ["OUT"], f"compiled-{drafter}.tgz"), "w:gz") as tar:
                tar.add(kept, arcname="compiled")
    out["shipped"] = [f"{p.relative_to(PACKAGE_FOLDER)}: {p.stat().st_size} bytes"
                      for p in PACKAGE_FOLDER.rglob(f"*{SUFFIX}")]
    out["with_artifacts"] = launch(work, f"{drafter}-shipped", data, preset, flags, device)
    out["with_artifacts_and_triton_cache"] = launch(work, f"{drafter}-shipped-triton", data, preset, flags,
                                                    device, triton_cache=work / f"{drafter}-cold" / "triton")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drafters", nargs="+", choices=["eagle3", "dflash"], default=["eagle3", "dflash"])
    parser.add_argument("--smoke", action="store_true", help="on the CPU, the tiny preset")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a call's `timeout`: the sets go back all the same
    # held until the sets are aside and the finally below would put them back: a SIGTERM
    # between the removal and the rename that put them back at the start lost them
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    if ASIDE.exists():
        shutil.rmtree(PACKAGE_FOLDER, ignore_errors=True)
        ASIDE.rename(PACKAGE_FOLDER)
    report = {}
    with tempfile.TemporaryDirectory(prefix="fresh-box-") as work:
        if PACKAGE_FOLDER.exists():
            PACKAGE_FOLDER.rename(ASIDE)
        try:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
            for drafter in args.drafters:
                report[drafter] = fresh_box(drafter, args.smoke, Path(work))
                shutil.rmtree(PACKAGE_FOLDER, ignore_errors=True)  # each drafter's box is fresh
                text = json.dumps(report, indent=1)  # each drafter's as it ends: a call's limit may cut the next
                print(text, flush=True)
                if os.environ.get("OUT"):
                    Path(os.environ["OUT"], "fresh-box.json").write_text(text)
        finally:
            shutil.rmtree(PACKAGE_FOLDER, ignore_errors=True)
            if ASIDE.exists():
                ASIDE.rename(PACKAGE_FOLDER)
    return 0


if __name__ == "__main__":
    sys.exit(main())
