import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.train_step import (idle_gaps, kernel_kind, kernel_summary, model_flops,
                              sample_lengths)
from training.config import DrafterConfig
from tests.bench_runs import run_bench

REPO = Path(__file__).resolve().parents[2]


def test_rows_are_filled_with_samples_of_the_span():
    lengths = sample_lengths(8192, seed=3)
    assert sum(lengths) == 8192
    assert all(1536 <= n <= 2560 for n in lengths[:-1]) and lengths[-1] <= 2560


def test_model_flops_counts_each_matmul_once_by_hand():
    cfg = DrafterConfig(hidden_size=4, num_heads=2, num_kv_heads=1, intermediate_size=6,
                        vocab_size=20, draft_vocab_size=10)  # head_dim 2: q 4, kv 2
    lengths, K = [16, 9], 2  # prompts of 2 and 1 tokens
    layer = 2 * 4 * (4 + 2 * 2) + 4 * 4 + 3 * 4 * 6  # qkv, o, mlp = 152
    head = 4 * 10
    per_token = 4 * 3 * 4 * 4 + 2 * 4 * 10  # fc forward + weight grad, verifier head
    # step 0 scores targets 2..15 and 1..8; step 1 targets 2..15 and 2..8
    scored = (14 + 8) + (14 + 7)
    pairs = 16 * 17 // 2 + 9 * 10 // 2  # causal pairs of each sample
    attention = sum(3.5 * 4 * (pairs + k * 25) * 4 for k in range(K))
    assert model_flops(cfg, lengths, K) == (25 * per_token + 25 * K * 6 * layer
                                            + scored * 6 * head + attention)
    # A frozen head: forward and the input gradient only.
    assert model_flops(cfg, lengths, K, head_grad=False) == (
        25 * per_token + 25 * K * 6 * layer + scored * 4 * head + attention)



def test_kernel_summary_counts_overlaps_once_and_sorts_kinds():
    # two steps' kernel events as a chrome trace lists them (µs); a matmul overlaps a copy
    kernels = [
        {"name": "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", "ts": 0, "dur": 6000},
        {"name": "void at::native::vectorized_elementwise_kernel<8, add>(int)",
         "ts": 5000, "dur": 2000},
        {"name": "triton_tem_fused_flex_attention_backward_1", "ts": 9000, "dur": 3000},
        {"name": "triton_poi_fused_mul_silu_0", "ts": 14000, "dur": 2000},
        {"name": "_fold_query_grads_kernel", "ts": 16000, "dur": 500},
    ]
    lines = kernel_summary(kernels, steps=2)
    # span 16.5 ms, busy 0-7, 9-12, 14-16.5: 12.5 ms, idle 4 ms; per step halves
    assert lines[0] == "per step: 8.2 ms from first kernel to last, 6.2 ms busy, 2.0 ms idle"
    assert [line.split("%")[1].strip() for line in lines[1:]] == [
        "matmul", "flex attention", "eager: at::native::vectorized_elementwise_kernel",
        "compiled (triton)", "diagonal-key fold (triton)"]
    assert lines[1].split()[0] == "3.00" and lines[1].split()[2] == "44.4"
    assert kernel_summary([], steps=2) == ["no kernels recorded"]
    assert kernel_kind("_chunk_losses_kernel") == "loss chunk (triton)"


def test_idle_gaps_lists_the_longest_first_with_their_neighbours_and_what_the_cpu_was_in():
    kernels = [{"name": "mm", "ts": 0, "dur": 6000},
               {"name": "copy", "ts": 1000, "dur": 1000},  # inside mm: no gap after it
               {"name": "flex", "ts": 7000, "dur": 1000},  # 1 ms after mm
               {"name": "silu", "ts": 11000, "dur": 500}]  # 3 ms after flex
    host = [{"cat": "cpu_op", "name": "aten::nonzero", "ts": 8200, "dur": 10},
            {"cat": "cpu_op", "name": "aten::empty", "ts": 8300, "dur": 1},
            {"cat": "cpu_op", "name": "aten::empty", "ts": 9000, "dur": 1},
            {"cat": "cpu_op", "name": "aten::mm", "ts": 500, "dur": 20},  # before any gap
            # the 3 ms gap: a frame spanning the whole step, one inside it spanning most
            # of the gap, and a CUDA call inside that; a frame over a third of it is not named
            {"cat": "python_function", "name": "train.py: step", "ts": 0, "dur": 12000},
            {"cat": "python_function", "name": "fp8.py: __call__", "ts": 8100, "dur": 2500},
            {"cat": "cuda_runtime", "name": "cudaHostAlloc", "ts": 8400, "dur": 2000},
            {"cat": "python_function", "name": "model.py: rotary", "ts": 10600, "dur": 1000}]
    lines = idle_gaps(kernels, host)
    assert lines == [
        "longest idle stretches (2 in all, 4.0 ms):",
        "      3000 us at     8.0 ms, after flex before silu; CPU: aten::empty x2, aten::nonzero x1;"
        " in: cudaHostAlloc 2.0 ms < fp8.py: __call__ 2.5 ms < train.py: step 12.0 ms",
        "      1000 us at     6.0 ms, after mm before flex; CPU: -; in: train.py: step 12.0 ms"]


@pytest.mark.slow
def test_smoke_runs_both_trackside_modes_and_writes_its_report(tmp_path):
    run_bench("train_step.py", "--smoke", "--timeline", "--trainers", "trackside",
              "trackside+ckpt", out=tmp_path, timeout=300)
    report = json.loads((tmp_path / "train_step.json").read_text())
    results = {r["trainer"]: r for r in report["results"]}
    assert set(results) == {"trackside", "trackside+ckpt"}
    for r in results.values():
        assert r["tokens_per_s"] > 0 and r["finite"]
    # --timeline: the layer's run in each of the cell's 3 TTT steps, then the forward,
    # backward and the optimizer, in order (on the CPU, its times alone)
    for r in results.values():
        assert [m["at"] for m in r["marks"]] == [
            "ttt step", "ttt step #2", "ttt step #3", "forward", "backward", "optimizer", "end"]
        times = [m["cpu_ms"] for m in r["marks"]]
        assert times == sorted(times) and all(m["gpu_ms"] is None for m in r["marks"])
    # Checkpointing recomputes the same step: the same first loss.
    assert results["trackside"]["loss_first"] == pytest.approx(
        results["trackside+ckpt"]["loss_first"], rel=1e-6)


def test_a_run_cut_short_keeps_the_children_it_finished(tmp_path):
    # as a device call's time limit ends a bench: after its first child, before the rest
    proc = subprocess.Popen([sys.executable, "bench/train_step.py", "--smoke", "--trainers",
                             "trackside+frozen+ckpt1", "trackside"], cwd=REPO,
                            env={**os.environ, "OUT": str(tmp_path)}, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        for line in proc.stdout:
            if line.startswith("tiny:512:3 #1"):
                break
    finally:
        proc.kill()
        proc.wait()
    results = json.loads((tmp_path / "train_step.json").read_text())["results"]
    assert [r["trainer"] for r in results] == ["trackside+frozen+ckpt1"]
    assert results[0]["tokens_per_s"] > 0
