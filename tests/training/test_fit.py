"""`trackside fit`: the report, calibration files, runs' metrics, the probe, bad values."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from training import fit
from training.config import PRESETS
from training.drafters.eagle3 import fit as eagle3_fit
from training.drafters.eagle3 import probe
from training.drafters.eagle3 import memory
from training.drafters.eagle3.memory import GiB, Calibration, StepShape
from tests.bench_runs import run_bench

REPO = Path(__file__).resolve().parents[2]


def run_fit(capsys, *args) -> tuple[int, str, str]:
    rc = fit.main(["fit", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_json_report_is_the_memory_model(capsys):
    rc, out, _ = run_fit(capsys, "--preset", "kimi-k2", "--max-seq-len", "65536",
                         "--ttt-steps", "5", "--json")
    assert rc == 0
    r = json.loads(out)
    p = memory.predict(PRESETS["kimi-k2"], StepShape(65536, 5))
    assert r["peak_gib"] == pytest.approx(p.total / GiB)
    assert r["fits"] is False and r["calibrated"] is False
    assert r["breakdown_bytes"] == p.breakdown()
    assert r["largest_max_seq_len"]["5"] == memory.largest_fitting(PRESETS["kimi-k2"], 5, 96)
    pairs = {(row["max_seq_len"], row["ttt_steps"]) for row in r["table"]}
    assert {(4096, 1), (65536, 7), (32768, 5)} <= pairs


def test_checkpoint_ttt_counts_the_steps_recomputed(capsys):
    llama = PRESETS["llama3-8b"]
    base = ["--preset", "llama3-8b", "--max-seq-len", "32768", "--ttt-steps", "7"]
    for flag, n in ((["--checkpoint-ttt", "2"], 2), (["--checkpoint-ttt"], 7),
                    (["--checkpoint-ttt", "9"], 7)):
        rc, out, _ = run_fit(capsys, *base, *flag, "--json")
        r = json.loads(out)
        assert rc == 0 and r["shape"]["checkpoint_ttt"] == n
        p = memory.predict(llama, StepShape(32768, 7, checkpoint_ttt=n))
        assert r["peak_gib"] == pytest.approx(p.total / GiB)
    rc, out, _ = run_fit(capsys, *base, "--checkpoint-ttt", "2")
    assert rc == 0 and "TTT steps 1-2 of 7 recomputed" in out.splitlines()[1]
    rc, out, _ = run_fit(capsys, *base, "--checkpoint-ttt")
    assert "every TTT step recomputed" in out.splitlines()[1]
    # a step that does not fit is told the fewest steps to recompute
    cap = memory.predict(llama, StepShape(32768, 7, checkpoint_ttt=2)).reserved / GiB + 1.5
    rc, out, _ = run_fit(capsys, *base, "--gpu-mem-gib", f"{cap:.2f}", "--json")
    r = json.loads(out)
    assert r["fits"] is False and r["fewest_checkpoint_ttt"] == 2
    rc, out, _ = run_fit(capsys, *base, "--gpu-mem-gib", f"{cap:.2f}")
    assert out.splitlines()[2] == "  fits with --checkpoint-ttt 2"
    rc, out, _ = run_fit(capsys, *base, "--gpu-mem-gib", "16")
    assert "does not fit even with every TTT step recomputed" in out.splitlines()[2]


# kimi-k2 × TTT 5, every step recomputed, head frozen, --offload-saved: the runs' own
# metrics as the GPU wrote them (docs/benchmarks.md, "kimi-k2 at TTT 5 under a 96 GiB cap"):
# 131,072 under a 96 GiB cap on an H200, 65,536 under 76 GiB on an H100.
OFFLOAD_RUNS = {131072: REPO / "bench/results/h200-offload-try5-131072-metrics.jsonl",
                65536: REPO / "bench/results/h200-offload-65536-s49-h100-metrics.jsonl"}
OFFLOAD_FLAGS = ("--preset", "kimi-k2", "--gpu-mem-gib", "96", "--ttt-steps", "5",
                 "--checkpoint-ttt", "--freeze-lm-head", "--max-seq-len", "131072")


@pytest.mark.parametrize("length", sorted(OFFLOAD_RUNS))
def test_offload_saved_predicts_the_measured_peak(capsys, length):
    """The offloaded step's peak within 5 % of the GPU's (without the option the model
    says 120 GiB at 131,072: the kept terms and AdamW's state are on the host's side)."""
    events = [json.loads(line) for line in OFFLOAD_RUNS[length].read_text().splitlines()]
    assert events[0]["config"]["offload_saved"] is True
    assert events[0]["config"]["max_seq_len"] == length
    measured = max(e["peak_mem_gib"] for e in events if e["event"] == "step")
    rc, out, _ = run_fit(capsys, *OFFLOAD_FLAGS[:-1], str(length), "--offload-saved", "--json")
    r = json.loads(out)
    assert rc == 0 and r["shape"]["offload_saved"] is True
    assert abs(r["peak_gib"] - measured) / measured <= 0.05, (r["peak_gib"], measured)
    host = r["host_breakdown_bytes"]
    assert {"kept_loss_inputs", "kept_hidden", "adamw_state"} <= set(host)
    assert not {"kept_loss_inputs", "kept_hidden", "adamw_state"} & set(r["breakdown_bytes"])
    # the same run read back with --from-run is the offloaded step too
    assert memory.shape_from_start(events[0])[1].offload_saved is True


def test_offload_saved_is_named_with_its_cost(capsys):
    rc, out, _ = run_fit(capsys, *OFFLOAD_FLAGS)
    assert rc == 0
    lines = out.splitlines()
    longest = next(line for line in lines if "largest that fits with --offload-saved" in line)
    without = int(lines[0].rsplit("largest that fits: ", 1)[1].replace(",", ""))
    assert int(longest.rsplit(" ", 1)[1].replace(",", "")) > without
    # a length only the option makes fit: named, with its host memory and its cost
    rc, out, _ = run_fit(capsys, *OFFLOAD_FLAGS[:-1], "100352", "--json")
    r = json.loads(out)
    assert r["fits"] is False and r["with_offload_saved"]["fits"] is True
    rc, out, _ = run_fit(capsys, *OFFLOAD_FLAGS[:-1], "100352")
    said = out.splitlines()[2]
    assert said.startswith("  fits with --offload-saved: ") and "pinned host memory" in said
    assert eagle3_fit.OFFLOAD_COST in said
    rc, out, _ = run_fit(capsys, *OFFLOAD_FLAGS, "--offload-saved")
    assert out.splitlines()[2].startswith("  host: ") and "adamw_state 7.2" in out
    rc, _, err = run_fit(capsys, "--drafter", "dflash", "--preset", "qwen3-8b", "--offload-saved")
    assert rc == 2 and "--offload-saved: not for --drafter dflash" in err


def test_text_report(capsys):
    rc, out, _ = run_fit(capsys, "--preset", "llama3-8b", "--gpu-mem-gib", "80",
                         "--ttt-steps", "3")
    assert rc == 0
    largest = memory.largest_fitting(PRESETS["llama3-8b"], 3, 80)
    first = out.splitlines()[0]
    assert first.startswith("16384 @ TTT 3: ") and "card has 80 GiB — fits" in first
    assert first.endswith(f"largest that fits: {largest:,}")
    assert "uncalibrated" in out and f"TTT 3: {largest:,}" in out


def test_config_file_and_calibration_file(tmp_path, capsys):
    cfg = PRESETS["llama3-8b"]
    (tmp_path / "drafter.json").write_text(json.dumps(cfg.to_dict()))
    cal = Calibration(scales={"constant": 1.0, "per_token": 1.0, "per_step": 1.5,
                              "diagonal": 1.0}, reserved_slack=20 * GiB)
    cal.save(tmp_path / "cal.json")
    rc, out, _ = run_fit(capsys, "--model-config", str(tmp_path / "drafter.json"),
                         "--calibration", str(tmp_path / "cal.json"), "--json")
    assert rc == 0
    r = json.loads(out)
    assert r["calibrated"] is True
    predicted = memory.predict(cfg, StepShape(16384, 5), cal)
    assert r["peak_gib"] == pytest.approx(predicted.total / GiB)
    assert r["reserved_gib"] == pytest.approx(predicted.total / GiB + 20)  # the slack wins


def write_run(path: Path, cfg, max_seq_len: int, ttt_steps: int, peak_gib: float) -> Path:
    """A run directory as training/loop.py leaves it (the fields fit reads)."""
    config = {"model": cfg.to_dict(), "max_seq_len": max_seq_len, "ttt_steps": ttt_steps,
              "batch_rows": 1, "loss_chunk": 2048, "precision": "bf16", "sharding": "ddp",
              "device": "cuda"}
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("\n".join([
        json.dumps({"event": "start", "config": config, "world_size": 1}),
        json.dumps({"event": "step", "step": 1, "peak_mem_gib": peak_gib - 0.5}),
        json.dumps({"event": "step", "step": 2, "peak_mem_gib": peak_gib})]) + "\n")
    return path


def test_from_run_recalibrates_and_saves(tmp_path, capsys):
    cfg = PRESETS["llama3-8b"]
    run = write_run(tmp_path / "run", cfg, 8192, 5, 23.0)
    rc, out, _ = run_fit(capsys, "--from-run", str(run), "--calibration",
                         str(tmp_path / "cal.json"), "--json")
    assert rc == 0
    r = json.loads(out)
    # The run's own shape is the default request, and the run's peak is reproduced (up to
    # the analytic prior's slight pull).
    assert r["shape"]["max_seq_len"] == 8192 and r["shape"]["ttt_steps"] == 5
    assert r["forward_backward_gib"] == pytest.approx(23.0, rel=2e-3)
    saved = Calibration.load(tmp_path / "cal.json")
    assert saved.scales == pytest.approx(r["calibration"]["scales"])
    # A new request for that drafter, from the recalibrated model.
    rc, out, _ = run_fit(capsys, "--from-run", str(run), "--max-seq-len", "16384", "--json")
    assert json.loads(out)["peak_gib"] == pytest.approx(
        memory.predict(cfg, StepShape(16384, 5), saved).total / GiB)


def test_from_several_runs(tmp_path, capsys):
    cfg = PRESETS["llama3-8b"]
    a = write_run(tmp_path / "a", cfg, 8192, 5, 18.0)  # as the H200 measured them
    b = write_run(tmp_path / "b", cfg, 32768, 7, 56.3)
    rc, out, _ = run_fit(capsys, "--from-run", str(a), "--from-run", str(b), "--json")
    assert rc == 0
    cal = Calibration.from_dict(json.loads(out)["calibration"])
    for length, k, peak in ((8192, 5, 18.0), (32768, 7, 56.3)):  # two points, both met
        assert memory.predict(cfg, StepShape(length, k), cal).forward_backward / GiB == \
            pytest.approx(peak, rel=1e-3)
    other = write_run(tmp_path / "other", PRESETS["kimi-k2"], 8192, 5, 50.0)
    rc, _, err = run_fit(capsys, "--from-run", str(a), "--from-run", str(other))
    assert rc == 2 and f"--from-run {other}" in err


@pytest.mark.parametrize("args,flag", [
    (["--preset", "huge"], "--preset"),
    ([], "--preset"),
    (["--preset", "tiny", "--max-seq-len", "0"], "--max-seq-len"),
    (["--preset", "tiny", "--ttt-steps", "-2"], "--ttt-steps"),
    (["--preset", "tiny", "--batch-rows", "0"], "--batch-rows"),
    (["--preset", "tiny", "--loss-chunk", "0"], "--loss-chunk"),
    (["--preset", "tiny", "--gpu-mem-gib", "0"], "--gpu-mem-gib"),
    (["--preset", "tiny", "--gpu-mem-gib", "nan"], "--gpu-mem-gib"),
    (["--preset", "tiny", "--ttt-steps", "three"], "--ttt-steps"),
    (["--preset", "tiny", "--precision", "fp8"], "--precision"),
    (["--preset", "tiny", "--world-size", "0"], "--world-size"),
    (["--preset", "tiny", "--multiple", "0"], "--multiple"),
    (["--preset", "tiny", "--checkpoint-ttt", "-1"], "--checkpoint-ttt"),
    (["--preset", "tiny", "--model-config", "x.json"], "--model-config"),
    (["--model-config", "/nonexistent/drafter.json"], "--model-config"),
    (["--preset", "tiny", "--calibration", "/nonexistent/cal.json"], "--calibration"),
    (["--from-run", "/nonexistent/run"], "--from-run"),
    (["--preset", "tiny", "--probe", "--from-run", "/tmp"], "--probe"),
])
def test_bad_values_exit_2_naming_the_flag(capsys, args, flag):
    rc, out, err = run_fit(capsys, *args)
    assert rc == 2 and out == ""
    assert flag in err


@pytest.mark.parametrize("flag, value", [("--ttt-steps", "17"), ("--max-seq-len", "64"),
                                         ("--checkpoint-ttt", "17"), ("--batch-rows", "0")])
def test_fit_takes_the_trainers_ranges_and_says_what_train_says(capsys, flag, value):
    """One table of ranges (training/params.py) for `train` and `fit`: what one refuses the
    other refuses, in the same words."""
    from training.cli import main as trackside_training

    rc, _, fit_err = run_fit(capsys, "--preset", "tiny", flag, value)
    assert rc == 2
    assert trackside_training(["train", "--synthetic", flag, value]) == 2
    train_err = capsys.readouterr().err
    assert fit_err.removeprefix("trackside fit: ") == train_err.removeprefix("trackside train: ")


@pytest.mark.parametrize("args, said", [
    (["--gpu-mem-gib", "1"], "--gpu-mem-gib 1 leaves nothing beside the 1 GiB of --headroom-gib"),
    (["--gpu-mem-gib", "0.5"], "--gpu-mem-gib 0.5 leaves nothing beside the 1 GiB of --headroom-gib"),
    (["--headroom-gib", "8", "--gpu-mem-gib", "8"], "--headroom-gib 8 leaves nothing of --gpu-mem-gib 8"),
    (["--headroom-gib", "-1"], "--headroom-gib must be 0 or more, got -1"),
])
def test_the_memory_flags_refused_are_the_ones_given(capsys, args, said):
    """A card too small for the default headroom is refused as the card the user gave."""
    rc, out, err = run_fit(capsys, "--preset", "tiny", *args)
    assert (rc, out) == (2, "") and len(err.splitlines()) == 1 and err.startswith(f"trackside fit: {said}")


def test_config_is_the_hosts_file_everywhere_else(tmp_path, capsys):
    """`--config` names the hosts TOML in every other command: fit's drafter JSON is
    --model-config, as train's is, and fit's --config says so."""
    (tmp_path / "drafter.json").write_text(json.dumps(PRESETS["tiny"].to_dict()))
    rc, out, err = run_fit(capsys, "--config", str(tmp_path / "drafter.json"))
    assert (rc, out) == (2, "") and len(err.strip().splitlines()) == 1
    assert "--model-config" in err
    rc, out, err = run_fit(capsys, "--model-config", str(tmp_path / "drafter.json"), "--json")
    assert rc == 0, err
    assert json.loads(out)["config"] == PRESETS["tiny"].to_dict()


def test_bad_config_contents_name_the_flag(tmp_path, capsys):
    bad = tmp_path / "drafter.json"
    bad.write_text(json.dumps({**PRESETS["tiny"].to_dict(), "num_kv_heads": 3}))
    rc, _, err = run_fit(capsys, "--model-config", str(bad))
    assert rc == 2 and "--model-config" in err and "num_kv_heads" in err
    bad.write_text("{")
    rc, _, err = run_fit(capsys, "--model-config", str(bad))
    assert rc == 2 and "--model-config" in err


def test_through_the_trackside_command():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    ok = subprocess.run([sys.executable, "-m", "training", "fit", "--preset", "tiny",
                         "--json"], cwd=REPO, env=env, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["config"] == PRESETS["tiny"].to_dict()
    bad = subprocess.run([sys.executable, "-m", "training", "fit", "--preset", "tiny",
                          "--max-seq-len", "-1"], cwd=REPO, env=env, capture_output=True,
                         text=True)
    assert bad.returncode == 2 and "--max-seq-len" in bad.stderr


def test_a_reader_that_stops_early_gets_no_traceback():
    # `trackside fit | head -1`: the pipe is closed before the report is written
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "tui.cli", "fit", "--preset", "tiny"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait() == 1 and "Traceback" not in err, err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_probe_without_a_gpu_fails_clearly(capsys):
    rc, _, err = run_fit(capsys, "--preset", "tiny", "--probe")
    assert rc == 1 and "CUDA" in err


def test_probe_on_cpu_calibrates_to_its_measurements():
    """The probe's machinery on CPU: real steps of the tiny drafter (saved-tensor bytes
    stand in for the allocator's peak), five points, four scales. The CPU's dense
    attention keeps L×L scores the model does not have, so the fit is close, not exact."""
    shape = StepShape(128, 1, precision="fp32")
    log = []
    cal = probe.run_probe(PRESETS["tiny"], shape, points=probe.SMOKE_POINTS,
                        device=torch.device("cpu"), log=log.append)
    assert len(log) == len(probe.SMOKE_POINTS)
    for m in (memory.Measurement(**d) for d in cal.fitted_on["measurements"]):
        p = memory.predict(PRESETS["tiny"], StepShape(m.max_seq_len, m.ttt_steps,
                                                      precision="fp32"), cal)
        error = abs(p.forward_backward - m.peak_bytes) / m.peak_bytes
        assert error <= cal.fitted_on["max_error"] + 1e-5  # predict rounds to bytes
    assert cal.fitted_on["max_error"] < 0.15


def test_probe_points_shrink_for_a_smaller_card():
    kimi, shape = PRESETS["kimi-k2"], StepShape(16384, 5)
    assert probe.probe_points(kimi, shape, 141 * GiB) == probe.PROBE_POINTS  # an H200
    smaller = probe.probe_points(kimi, shape, 36 * GiB)
    assert smaller == tuple((n // 2, k) for n, k in probe.PROBE_POINTS)
    assert all(memory.predict(kimi, StepShape(n, k)).total < 0.8 * 36 * GiB
               for n, k in smaller)


def test_random_batch_shapes():
    cfg = PRESETS["tiny"]
    b = probe.random_batch(cfg, 300, 2, torch.device("cpu"), torch.float32, sample_len=128)
    assert b.aux_hidden.shape == (2, 300, 3 * cfg.hidden_size)
    assert b.final_hidden.shape == (2, 300, cfg.hidden_size)
    assert b.doc_ids[0].tolist() == [0] * 128 + [1] * 128 + [2] * 44
    assert b.position_ids[0, 127:130].tolist() == [127, 0, 1]
    assert bool(b.loss_mask.all()) and b.num_samples == 6


@pytest.mark.slow
def test_bench_smoke_writes_its_report(tmp_path):
    run_bench("memory_probe.py", "--smoke", out=tmp_path, timeout=240)
    text = (tmp_path / "memory.md").read_text()
    assert "| tiny |" in text and "largest fitting" in text
    results = json.loads((tmp_path / "memory.json").read_text())
    assert results[0]["shape"] == "tiny" and len(results[0]["rows"]) >= 4


@pytest.mark.gpu
def test_probe_on_the_gpu(tmp_path, capsys):
    rc, out, err = run_fit(capsys, "--preset", "llama3-8b", "--probe", "--calibration",
                           str(tmp_path / "cal.json"), "--json")
    assert rc == 0, err
    cal = Calibration.load(tmp_path / "cal.json")
    for m in (memory.Measurement(**d) for d in cal.fitted_on["measurements"]):
        p = memory.predict(PRESETS["llama3-8b"], StepShape(m.max_seq_len, m.ttt_steps), cal)
        assert abs(p.forward_backward - m.peak_bytes) / m.peak_bytes < 0.10
    assert json.loads(out)["calibrated"] is True
