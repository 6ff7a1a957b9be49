"""The trainer on a full disk: a checkpoint that does not fit leaves the last whole one in
place, no half-written files, and an end event that says so; no traceback. The disk is a
real one: a tmpfs just too small for a second checkpoint (mounting needs root)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.waiting import niced
from training import checkpoint
from training.config import PRESETS
from training.loop import TrainConfig, train
from training.synthetic import synthetic_dataset

ROOT = Path(__file__).resolve().parents[2]


def tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


@pytest.fixture
def small_disk(tmp_path):
    """mount(size) -> a fresh tmpfs of `size` bytes, unmounted after the test."""
    mounted = []

    def mount(size: int) -> Path:
        where = tmp_path / f"disk{len(mounted)}"
        where.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                              capture_output=True, text=True)
        if done.returncode:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounted.append(where)
        return where
    yield mount
    for where in mounted:
        subprocess.run(["umount", str(where)], check=True)


def test_a_checkpoint_that_does_not_fit_keeps_the_last_whole_one(tmp_path, cache, small_disk):
    data = synthetic_dataset(0)
    # One checkpoint's size, from a run on the ordinary disk.
    probe = tmp_path / "probe"
    assert train(TrainConfig(data=data, run_dir=probe, drafter=PRESETS["tiny"],
                             max_seq_len=512, steps=1)) == 0
    size = tree_bytes(checkpoint.latest(probe / "checkpoints"))
    # Room for the metrics and one checkpoint and a half: step 2's fits, step 4's does not.
    run_dir = small_disk(int(1.5 * size) + 256 * 1024) / "run"
    result = subprocess.run(
        niced([sys.executable, "-m", "training", "train", "--data", str(data), "--max-seq-len", "512",
               "--steps", "4", "--save-every", "2", "--out", str(run_dir)]),
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr and "SafetensorError" not in result.stderr
    kept = run_dir / "checkpoints" / "step-2"
    assert f"no space left on device" in result.stderr and str(kept) in result.stderr
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    end = events[-1]
    assert end["event"] == "end" and end["status"] == "failed"
    assert end["checkpoint"] == str(kept) and "No space left on device" in end["reason"]
    assert [e["step"] for e in events if e["event"] == "checkpoint"] == [2]
    # What is left is whole: the kept step loads, nothing half-written lies beside it.
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["latest", "step-2"]
    weights, state, _ = checkpoint.load(kept)
    assert state["step"] == 2 and weights
