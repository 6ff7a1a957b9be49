"""A step whose loss or gradient is not finite is never applied (training/nonfinite.py):
real runs on the CPU over data with NaN hidden states, which make a real NaN loss."""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.waiting import niced
from training.checkpoint import latest
from training.config import PRESETS
from training.contract import EXIT_NONFINITE
from training.data import Dataset, sample_path, write_tensors_atomic
from training.drafters.dflash.step import OffsetLoss
from training.loop import TrainConfig, train
from training.nonfinite import Verdict
from training.optimizer import _folds_clip, optimizer_step, warmup_cosine
from training.synthetic import synthetic_dataset

ROOT = Path(__file__).resolve().parents[2]


def poisoned(tmp_path: Path, every: int) -> Path:
    """The synthetic data set with NaN aux hidden states in every `every`-th sample."""
    data = tmp_path / "data"
    shutil.copytree(synthetic_dataset(0), data)
    for i in range(0, Dataset(data).info["num_samples"], every):
        tensors = load_file(sample_path(data, i))
        tensors["aux_hidden"] = torch.full_like(tensors["aux_hidden"], math.nan)
        write_tensors_atomic(sample_path(data, i), tensors)
    return data


def events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def config(data: Path, run_dir: Path, **kw) -> TrainConfig:
    return TrainConfig(data=data, run_dir=run_dir, drafter=PRESETS["tiny"], max_seq_len=512,
                       lr=3e-3, **kw)


def test_a_nonfinite_step_is_skipped_and_the_run_trains_on(tmp_path, cache):
    run_dir = tmp_path / "run"
    steps = 12
    code = train(config(poisoned(tmp_path, every=8), run_dir, steps=steps, max_nonfinite=steps))
    assert code == 0
    got = events(run_dir)
    skipped = [e for e in got if e["event"] == "nonfinite"]
    applied = [e for e in got if e["event"] == "step"]
    assert skipped and all(e["what"] == "loss" for e in skipped)
    assert set(skipped[0]) == {"event", "time", "step", "what", "in_a_row"}
    # Every step event is an applied step: finite, numbered 1.. with no gaps, and the
    # schedule moved only on them (a skipped step's number is the next applied one's).
    assert [e["step"] for e in applied] == list(range(1, steps + 1))
    assert all(math.isfinite(e["loss"]) and math.isfinite(e["grad_norm"]) for e in applied)
    factor = warmup_cosine(max(1, min(100, steps // 10)), steps)
    assert [e["lr"] for e in applied] == pytest.approx([3e-3 * factor(s) for s in range(steps)])
    assert {e["step"] for e in skipped} <= {e["step"] for e in applied}
    assert got[-1] == {**got[-1], "event": "end", "status": "completed"}
    weights = load_file(latest(run_dir / "checkpoints") / "model.safetensors")
    assert all(torch.isfinite(t).all() for t in weights.values() if t.is_floating_point())


def test_nonfinite_steps_in_a_row_end_the_run_with_exit_4(tmp_path, cache):
    run_dir = tmp_path / "run"
    code = train(config(poisoned(tmp_path, every=1), run_dir, steps=10, max_nonfinite=3))
    assert code == EXIT_NONFINITE == 4
    got = events(run_dir)
    assert [e["event"] for e in got] == ["start", "nonfinite", "nonfinite", "nonfinite", "end"]
    # each tried step 1 again, on the next batch: none was applied
    assert [(e["step"], e["in_a_row"]) for e in got[1:4]] == [(1, 1), (1, 2), (1, 3)]
    assert got[-1]["status"] == "nonfinite"
    assert latest(run_dir / "checkpoints") is None  # no step was applied: nothing to keep


def test_the_cli_stops_a_poisoned_run_with_exit_4_and_says_why(tmp_path, cache):
    run_dir = tmp_path / "run"
    result = subprocess.run(
        niced([sys.executable, "-m", "training", "train", "--data", str(poisoned(tmp_path, every=1)),
               "--max-seq-len", "512", "--steps", "10", "--max-nonfinite", "2", "--out", str(run_dir)]),
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 4, result.stderr
    assert "step 1 not applied: its loss is not finite (2 in a row" in result.stdout
    assert "stopped after 2 steps in a row" in result.stderr
    assert "Traceback" not in result.stderr
    assert events(run_dir)[-1]["status"] == "nonfinite"


@pytest.mark.parametrize("fused_clip", [True, False])
def test_a_refused_step_applies_nothing_and_drops_the_gradients(fused_clip):
    """A NaN gradient with a finite loss: the norm is what is named, and neither the
    weights nor AdamW's state move (its step count stays absent)."""
    w = torch.nn.Parameter(torch.ones(4))
    # fused: the clip folded into AdamW's grad_scale, as on CUDA; else clip_grad_norm_,
    # the path sharded gradients take
    optimizer = torch.optim.AdamW([w], lr=0.1, fused=fused_clip)
    assert _folds_clip(optimizer) == fused_clip
    w.grad = torch.tensor([1.0, math.nan, 0.0, 2.0])
    verdict = Verdict([unit()], 1)
    norm = optimizer_step(optimizer, [w], 1.0, apply=verdict)
    assert verdict.what == "grad_norm" and math.isnan(norm.item())
    assert math.isnan(verdict.grad_norm)
    assert torch.equal(w.detach(), torch.ones(4)) and w.grad is None
    assert not optimizer.state
    w.grad = torch.ones(4)
    verdict = Verdict([unit()], 1)
    optimizer_step(optimizer, [w], 1.0, apply=verdict)
    assert verdict.what is None and not torch.equal(w.detach(), torch.ones(4))


def unit(losses=(1.0, 1.0, 1.0), agree=(True, False, True)) -> OffsetLoss:
    return OffsetLoss(torch.tensor(losses), torch.tensor(agree))


def test_the_verdict_reads_the_events_sums_and_norm_with_its_check():
    """The step's one read: each unit's loss and agreement sums (losses first) and the
    gradient norm come back with the finite flags, so the loop reads nothing once the
    optimizer is queued."""
    verdict = Verdict([unit((0.5, 1.5)), unit((2.0,), (False,))], 1)
    assert verdict(torch.tensor(3.25))
    assert verdict.sums == [2.0, 2.0, 2.0, 0.0] and verdict.grad_norm == 3.25
    verdict = Verdict([unit((math.inf,), (True,))], 1)
    assert not verdict(torch.tensor(1.0)) and verdict.what == "loss"


def test_over_ranks_the_verdict_sums_its_flags_and_sums_but_not_the_norm(monkeypatch):
    """Two ranks as the sum over them sees it (each value twice): the flags and the units'
    sums are summed, the norm (the whole drafter's already) is not; a rank whose loss is
    not finite makes every rank skip."""
    monkeypatch.setattr("training.nonfinite.sum_over_ranks", lambda t, world: t.mul_(world))
    verdict = Verdict([unit((0.5, 1.5)), unit((2.0,), (False,))], 2)
    assert verdict(torch.tensor(3.25))
    assert verdict.sums == [4.0, 4.0, 4.0, 0.0] and verdict.grad_norm == 3.25
    verdict = Verdict([unit((math.nan,))], 2)
    assert not verdict(torch.tensor(1.0)) and verdict.what == "loss"
    verdict = Verdict([], 2)  # a rank with no scored positions: the norm alone is checked
    assert not verdict(torch.tensor(math.inf)) and verdict.what == "grad_norm"
    assert verdict.sums == []


def test_a_run_skipping_steps_is_an_alert_while_it_runs_and_none_once_it_trains_again(tmp_path, cache):
    """The dashboard and `watch` fold the trainer's real events: skipped steps since the
    last applied one are an error alert while the run goes on (not only at its end)."""
    from backends.alerts import RunFacts, run_alerts
    from backends.logs.record import MetricsRecord
    from backends.runs import RunInfo, RunPhase

    run_dir = tmp_path / "run"
    assert train(config(poisoned(tmp_path, every=1), run_dir, steps=10, max_nonfinite=2)) == EXIT_NONFINITE
    running = [e for e in events(run_dir) if e["event"] != "end"]  # as a listing saw it mid-run
    record = MetricsRecord(keep=50)
    for event in running:
        record.add(event)
    info = RunInfo("r", "s", "box", RunPhase.RUNNING, pids=[1])
    [alert] = run_alerts(RunFacts("box/r", info, record.steps, record.oom, record.nonfinite), 0.0)
    assert alert.key == "skipping:box/r" and alert.severity == "error"
    assert "skipping 2 steps in a row at step 1: its loss is not finite (none applied)" in alert.text
    record.add({"event": "step", "time": 1.0, "step": 1, "loss": 2.0})  # a later batch trained
    assert run_alerts(RunFacts("box/r", info, record.steps, record.oom, record.nonfinite), 1.0) == []
