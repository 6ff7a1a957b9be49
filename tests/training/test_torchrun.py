"""torchrun with 2 CPU processes (gloo) follows the loss trajectory of one process that
takes the same global batch; its ranks agree on whether --out already holds a run.

The loss is normalised by the global count of scored positions per TTT step, so the two
compute the same quantity and differ only in float summation order (the all-reduce of
gradients): a relative tolerance of 1e-5 per step over 8 steps (measured: ~1e-7).
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.waiting import niced

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
    single = subprocess.run(niced([sys.executable, "-m", "training", *ARGS, "--batch-rows", "2",
                                   "--out", str(tmp_path / "one")]), cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=180)
    assert single.returncode == 0, single.stderr
    ranks = subprocess.run(niced([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                  "--nproc_per_node", "2", "-m", "training", *ARGS,
                                  "--batch-rows", "1", "--out", str(tmp_path / "two")]),
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


# Imported by every Python process of a test that puts its directory on PYTHONPATH: rank 1
# holds back until rank 0 has written the run's metrics.jsonl (the order that lost the race
# when each rank checked --out for itself), or for a bound, since a trainer that decides
# before any rank writes has rank 0 wait for rank 1 instead.
LATE_RANK_1 = textwrap.dedent("""
    import os
    import time
    from pathlib import Path

    if os.environ.get("RANK") == "1":
        written = Path(os.environ["LATE_RANK_WAITS_FOR"])
        deadline = time.monotonic() + float(os.environ["LATE_RANK_WAITS_S"])
        while not written.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
""")


@pytest.mark.slow
def test_a_rank_that_looks_at_out_after_rank_0_wrote_it_still_trains(tmp_path_factory, tmp_path):
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(LATE_RANK_1)
    out = tmp_path / "run"
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path_factory.getbasetemp() / "xdg-cache"),
           "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(hook), str(ROOT)]),
           # gloo connects its ranks at the first collective, as NCCL does: rank 0 runs on
           # while rank 1 is still starting
           "TORCH_GLOO_LAZY_INIT": "1",
           "LATE_RANK_WAITS_FOR": str(out / "metrics.jsonl"), "LATE_RANK_WAITS_S": "15"}
    ranks = subprocess.run(niced([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                  "--nproc_per_node", "2", "-m", "training", "train", "--synthetic",
                                  "--steps", "2", "--max-seq-len", "128", "--ttt-steps", "1",
                                  "--out", str(out)]),
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert ranks.returncode == 0, ranks.stderr[-3000:]
    events = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert events[0]["event"] == "start" and events[0]["world_size"] == 2
    assert events[-1] == {**events[-1], "event": "end", "status": "completed"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_an_out_that_holds_a_run_is_refused_by_every_rank_with_one_message(tmp_path_factory,
                                                                            tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"event": "start"}\n')
    # The variables torchrun gives its workers, each rank started here: each one's exit
    # status is its own, not torchrun's summary of the first to fail.
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path_factory.getbasetemp() / "xdg-cache"),
           "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
           "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
    ranks = [subprocess.Popen(niced([sys.executable, "-m", "training", "train", "--synthetic",
                                     "--steps", "2", "--out", str(out)]), cwd=ROOT,
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in (0, 1)]
    ended = [rank.communicate(timeout=120) for rank in ranks]
    assert [rank.returncode for rank in ranks] == [2, 2], [err[-2000:] for _, err in ended]
    said = [line for _, err in ended for line in err.splitlines() if line.strip()]
    assert said == [(f"trackside train: --out {out} already holds a run; pass --resume "
                     "or choose another directory")]
    assert (out / "metrics.jsonl").read_text() == '{"event": "start"}\n'
    assert sorted(p.name for p in out.iterdir()) == ["metrics.jsonl"]  # nothing written
