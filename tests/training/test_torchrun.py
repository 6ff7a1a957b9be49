"""torchrun with 2 CPU processes (gloo) follows the loss trajectory of one process that
takes the same global batch.

The loss is normalised by the global count of scored positions per TTT step, so the two
compute the same quantity and differ only in float summation order (the all-reduce of
gradients): a relative tolerance of 1e-5 per step over 8 steps (measured: ~1e-7).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARGS = ["train", "--synthetic", "--steps", "8", "--max-seq-len", "256", "--ttt-steps", "3",
        "--save-every", "0"]


def steps(run_dir: Path) -> list[dict]:
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [e for e in events if e["event"] == "step"]


def losses(run_dir: Path) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in steps(run_dir)}


@pytest.mark.slow
def test_two_gloo_ranks_match_one_process_with_the_same_global_batch(tmp_path_factory,
                                                                      tmp_path):
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path_factory.getbasetemp() / "xdg-cache"),
           "OMP_NUM_THREADS": "1"}
    single = subprocess.run([sys.executable, "-m", "training", *ARGS, "--batch-rows", "2",
                             "--out", str(tmp_path / "one")], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=180)
    assert single.returncode == 0, single.stderr
    ranks = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                            "--nproc_per_node", "2", "-m", "training", *ARGS,
                            "--batch-rows", "1", "--out", str(tmp_path / "two")],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert ranks.returncode == 0, ranks.stderr[-3000:]

    start = json.loads((tmp_path / "two" / "metrics.jsonl").read_text().splitlines()[0])
    assert start["world_size"] == 2 and start["config"]["global_batch_rows"] == 2
    one, two = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert list(one) == list(two) == list(range(1, 9))
    for step in one:
        assert two[step] == pytest.approx(one[step], rel=1e-5), step
    assert one[8] < one[1]  # it trains, too
    # Every rank's peak memory (RSS on CPU), rank 0's also as peak_mem_gib; one process has none.
    for two_step, one_step in zip(steps(tmp_path / "two"), steps(tmp_path / "one")):
        ranks = two_step["peak_mem_gib_ranks"]
        assert len(ranks) == 2 and all(r > 0 for r in ranks) and ranks[0] == two_step["peak_mem_gib"]
        assert "peak_mem_gib_ranks" not in one_step
