"""A relaunch's trainer started while the run it replaces still stops (training/handover.py):
real processes, the real trainer on the CPU."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.waiting import niced
from training.handover import StillRunning, alive, wait_for_exit

REPO = Path(__file__).resolve().parents[2]
TRAIN = niced([sys.executable, "-m", "training", "train", "--synthetic", "--preset", "tiny", "--device", "cpu",
               "--max-seq-len", "128", "--ttt-steps", "2", "--steps", "1"])


def events(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_the_trainer_waits_for_the_replaced_run_to_end_before_it_starts(tmp_path):
    replaced = subprocess.Popen(["sleep", "60"])
    trainer = subprocess.Popen([*TRAIN, "--out", str(tmp_path / "run"), "--after-pids", f"{replaced.pid}"],
                               cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        # Its imports first: on a loaded 2-core machine they took over a minute.
        deadline = time.monotonic() + 240
        while "waiting for the run this replaces" not in (trainer.stdout.readline() or ""):
            assert trainer.poll() is None and time.monotonic() < deadline, "the trainer never said it waits"
        time.sleep(2.0)  # it would have started by now, had it not waited
        assert trainer.poll() is None and not events(tmp_path / "run")
        ended = time.time()
        replaced.kill()
        replaced.wait()
        assert trainer.wait(timeout=120) == 0, trainer.stdout.read()
    finally:
        replaced.kill()
        trainer.kill()
    start = next(e for e in events(tmp_path / "run") if e["event"] == "start")
    assert start["time"] > ended and start["startup_s"]["replaced_run"] >= 2.0
    # The wait is its own phase, not counted as the imports'.
    assert start["startup_s"]["imports_device"] < start["time"] - start["process_started"] - 2.0


def test_a_replaced_run_that_never_ends_is_said_and_nothing_starts(tmp_path):
    replaced = subprocess.Popen(["sleep", "60"])
    try:
        with pytest.raises(StillRunning, match=f"PIDs {replaced.pid}"):
            wait_for_exit((replaced.pid,), wait_s=0.3)
    finally:
        replaced.kill()
        replaced.wait()


def test_an_exited_process_not_yet_reaped_has_ended():
    child = subprocess.Popen(["true"])
    deadline = time.monotonic() + 10
    while alive(child.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not alive(child.pid) and child.returncode is None  # a zombie, unreaped
    child.wait()


@pytest.mark.parametrize("pids", ["", "12,x", "0"])
def test_after_pids_must_be_pids(tmp_path, pids):
    result = subprocess.run([*TRAIN, "--out", str(tmp_path / "run"), "--after-pids", pids], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "--after-pids" in result.stderr
