"""bench/dflash_step.py on the CPU at tiny shapes: every mode runs its real children and
writes its report (speculators' child where speculators imports)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.bench_runs import run_bench

HAS_SPECULATORS = importlib.util.find_spec("speculators") is not None


def bench(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "out"
    out.mkdir()
    run_bench("dflash_step.py", "--smoke", *args, out=out, timeout=300)
    return json.loads((out / "dflash_step.json").read_text())


@pytest.mark.slow
def test_compare_mode_steps_each_trainer_and_a_new_shape(tmp_path):
    trainers = ["trackside", "speculators"] if HAS_SPECULATORS else ["trackside"]
    report = bench(tmp_path, "--new-shape", "--tokens-in-step", "--trainers", *trainers)
    results = report["results"]
    assert [r["trainer"] for r in results] == [trainers[0], "trackside", *trainers[1:],
                                               "trackside"]
    assert results[1]["tokens_in_step"] and not results[0].get("tokens_in_step")
    assert results[-1]["max_seq_len"] != results[0]["max_seq_len"]  # the new shape
    for r in results:
        assert "error" not in r, r
        assert r["tokens_per_s"] > 0 and r["first_step_s"] > 0 and r["setup_s"] > 0
        assert r["loss_first"] > 0
    # the same row, anchors and weights: the verifier's tokens made before the steps or in
    # them give the same losses
    assert results[0]["loss_first"] == pytest.approx(results[1]["loss_first"], rel=1e-5)
    assert results[0]["loss_last"] == pytest.approx(results[1]["loss_last"], rel=1e-5)


def test_an_fp8_child_has_no_predicted_peak_and_tells_its_timeline(tmp_path):
    """The memory model describes bf16 runs: an fp8 child's peak is not set beside one.
    --timeline: each layer's forward, the whole forward, backward and the optimizer, in
    the order a step reaches them (on the CPU, its times alone)."""
    (r,) = bench(tmp_path, "--fp8", "--timeline", "--trainers", "trackside")["results"]
    assert r["fp8"] and r["tokens_per_s"] > 0 and "predicted_gib" not in r
    layers = [f"layer {i}" for i in range(2)]  # the tiny preset's two
    assert [m["at"] for m in r["marks"]] == [*layers, "forward", "backward", "optimizer",
                                               "end"]
    times = [m["cpu_ms"] for m in r["marks"]]
    assert times == sorted(times) and times[0] > 0
    assert all(m["gpu_ms"] is None for m in r["marks"])


def test_story_mode_runs_chunked_and_unchunked_with_the_prediction(tmp_path):
    # on the CPU, unchunked once: its loss pass is the eager one (a GPU adds the eager
    # pass unchunked, the story's whole softmaxes, beside the Triton one)
    chunked, unchunked = bench(tmp_path, "--story")["results"]
    assert chunked["soft_kl"] == 0.15 and chunked["predicted_gib"] > 0
    assert unchunked["loss_chunk"] == unchunked["max_anchors"] * (unchunked["block_size"] - 1)
    # the unchunked loss holds every scored position's logits: predicted no smaller (the
    # tiny drafter's peak is in its backward, where the loss's chunks are gone)
    assert unchunked["predicted_gib"] >= chunked["predicted_gib"]
    for r in (chunked, unchunked):  # the CPU has room
        assert "tokens_per_s" in r, r


def test_each_trackside_child_is_set_against_speculators_on_a_line_of_its_own():
    # session 60's H100 call: the one line it printed set the child as extracted against
    # speculators, whose step makes the verifier's tokens itself
    from bench.dflash_step import against_speculators
    report = json.loads((Path(__file__).parents[2] / "bench/results/h200-fp8-s60-h100-dflash.json").read_text())
    assert against_speculators(report["results"], 8192) == [
        "trackside / speculators: 1.52× tokens/s, peak 0.59× speculators'",
        "trackside, tokens in the step / speculators: 1.39× tokens/s, peak 0.59× speculators'"]
    assert against_speculators([r for r in report["results"] if r["trainer"] == "trackside"], 8192) == []
