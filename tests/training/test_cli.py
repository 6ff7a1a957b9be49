"""Bad values on the trainer's command line exit 2 with a message naming the flag."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.waiting import niced
from training.cli import main
from training.synthetic import synthetic_dataset

ROOT = Path(__file__).resolve().parents[2]


def run_main(argv, capsys) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own exit for values it rejects
        code = exc.code
    return code, capsys.readouterr().err


@pytest.mark.parametrize("args, flag", [
    (["--max-seq-len", "0"], "--max-seq-len"),
    (["--max-seq-len", "lots"], "--max-seq-len"),
    (["--ttt-steps", "-1"], "--ttt-steps"),
    (["--ttt-decay", "1.5"], "--ttt-decay"),
    (["--steps", "0"], "--steps"),
    (["--steps", "5", "--epochs", "2"], "--epochs"),
    (["--lr", "0"], "--lr"),
    (["--lr", "nan"], "--lr"),
    (["--batch-rows", "0"], "--batch-rows"),
    (["--draft-vocab-size", "-3"], "--draft-vocab-size"),
    (["--preset", "gpt5"], "--preset"),
    (["--device", "tpu"], "--device"),
    (["--sharding", "zero3"], "--sharding"),
    (["--loss-chunk", "0"], "--loss-chunk"),
    (["--gpu-mem-gib", "-2"], "--gpu-mem-gib"),
    (["--save-every", "-1"], "--save-every"),
    (["--checkpoint-ttt", "-1"], "--checkpoint-ttt"),
    (["--seed", "x"], "--seed"),
    (["--data", "/nonexistent"], "--data"),
])
def test_bad_train_values_exit_2_naming_the_flag(args, flag, capsys):
    argv = ["train"] + ([] if "--data" in args else ["--synthetic"]) + args
    code, err = run_main(argv, capsys)
    assert code == 2
    assert flag in err


@pytest.mark.parametrize("args, flag", [
    (["--draft-vocab-size", "100000"], "--draft-vocab-size"),
    (["--preset", "llama3-8b"], "--preset"),
    (["--resume"], "--resume"),
    (["--device", "cpu", "--gpu-mem-gib", "8"], "--gpu-mem-gib"),
])
def test_values_wrong_for_the_data_exit_2_naming_the_flag(args, flag, cache, capsys):
    code, err = run_main(["train", "--synthetic"] + args, capsys)
    assert code == 2
    assert flag in err


def test_a_bad_model_config_exits_2(tmp_path, cache, capsys):
    (tmp_path / "drafter.json").write_text(json.dumps({"hidden_size": 64, "heads": 4}))
    code, err = run_main(["train", "--synthetic", "--model-config",
                          str(tmp_path / "drafter.json")], capsys)
    assert code == 2 and "--model-config" in err and "heads" in err


@pytest.mark.parametrize("flag, recorded", [([], 0), (["--checkpoint-ttt", "1"], 1),
                                           (["--checkpoint-ttt"], 2),  # bare: every step
                                           (["--checkpoint-ttt", "5"], 2)])  # at most all
def test_checkpoint_ttt_counts_the_steps_recomputed(flag, recorded, tmp_path, cache, capsys):
    out = tmp_path / "run"
    code, _ = run_main(["train", "--synthetic", "--steps", "1", "--ttt-steps", "2",
                        "--out", str(out), *flag, "--freeze-lm-head"], capsys)
    assert code == 0
    start = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert start["config"]["checkpoint_ttt"] == recorded
    assert start["config"]["freeze_lm_head"] is True  # a bare flag after it stays a flag


def test_a_synthetic_run_links_its_data_over_a_stale_link(tmp_path, cache, capsys):
    # what the ranks of a torchrun run each do: a link already there is replaced, not an error
    (tmp_path / "data").symlink_to(tmp_path / "gone")
    code, err = run_main(["train", "--synthetic", "--steps", "1", "--out", str(tmp_path)],
                         capsys)
    assert code == 0, err
    assert (tmp_path / "data").resolve() == synthetic_dataset(0).resolve()
    assert [p.name for p in tmp_path.glob(".data-*")] == []


def test_a_run_under_torchrun_needs_out(monkeypatch, cache, capsys):
    # each rank would name its own run directory (a timestamp and a random token)
    monkeypatch.setenv("WORLD_SIZE", "2")
    code, err = run_main(["train", "--synthetic", "--steps", "1"], capsys)
    assert code == 2 and "--out" in err and "torchrun" in err


def test_an_existing_run_dir_needs_resume(tmp_path, cache, capsys):
    (tmp_path / "metrics.jsonl").write_text("")
    code, err = run_main(["train", "--synthetic", "--out", str(tmp_path)], capsys)
    assert code == 2 and "--out" in err and "--resume" in err


@pytest.mark.parametrize("args, flag", [
    (["--layers", "1,2,1"], "--layers"),
    (["--layers", "a,b,c"], "--layers"),
    (["--max-tokens-per-batch", "0"], "--max-tokens-per-batch"),
    (["--prompts", "/nonexistent.jsonl"], "--prompts"),
])
def test_bad_extract_values_exit_2_naming_the_flag(args, flag, tmp_path, capsys):
    base = {"--model": "m", "--prompts": str(tmp_path / "p.jsonl"),
            "--out": str(tmp_path / "o")}
    (tmp_path / "p.jsonl").write_text('{"input_ids": [1, 2]}\n')
    for name, value in zip(args[::2], args[1::2]):
        base[name] = value
    code, err = run_main(["extract"] + [x for kv in base.items() for x in kv], capsys)
    assert code == 2
    assert flag in err


def test_extract_layers_out_of_range_for_the_model(tmp_path, capsys):
    config = {"model_type": "llama", "hidden_size": 16, "intermediate_size": 32,
              "num_hidden_layers": 4, "num_attention_heads": 2, "num_key_value_heads": 1,
              "vocab_size": 50}
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "p.jsonl").write_text('{"input_ids": [1, 2, 3]}\n')
    code, err = run_main(["extract", "--model", str(tmp_path / "config.json"), "--prompts",
                          str(tmp_path / "p.jsonl"), "--out", str(tmp_path / "o"),
                          "--layers", "0,1,9"], capsys)
    assert code == 2 and "--layers" in err and "0..3" in err


def test_the_module_entry_point_exits_2_as_a_process(tmp_path):
    result = subprocess.run(niced([sys.executable, "-m", "training", "train", "--synthetic",
                                   "--ttt-steps", "0"]), cwd=ROOT, capture_output=True, text=True,
                            env={**os.environ, "TRACKSIDE_RUNS_ROOT": str(tmp_path)})
    assert result.returncode == 2
    assert "--ttt-steps" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("changed, says", [
    (["--freeze-lm-head"], "--freeze-lm-head"),
    (["--preset", "tiny", "--draft-vocab-size", "128"], "does not fit this drafter"),
])
def test_a_resume_that_does_not_fit_the_checkpoint_exits_2(changed, says, tmp_path, cache,
                                                            capsys):
    run = ["train", "--synthetic", "--out", str(tmp_path / "run"), "--steps", "2",
           "--max-seq-len", "256", "--save-every", "1"]
    assert run_main(run, capsys)[0] == 0
    record = (tmp_path / "run" / "metrics.jsonl").read_text()
    code, err = run_main(run[:-2] + ["--steps", "3", "--resume"] + changed, capsys)
    assert code == 2 and "--resume" in err and says in err, err
    assert "Traceback" not in err
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == record  # still completed


def test_resume_with_no_checkpoint_says_it_starts_at_step_0(tmp_path, cache, capsys):
    code = main(["train", "--synthetic", "--steps", "1", "--max-seq-len", "128", "--out", str(tmp_path / "run"), "--resume"])
    out = capsys.readouterr().out
    assert code == 0 and f"--resume: no checkpoint in {tmp_path / 'run' / 'checkpoints'}: starting at step 0" in out


def test_resume_from_a_directory_with_no_checkpoint_refuses_to_start(tmp_path, cache, capsys):
    """Another run's checkpoint was asked for (R continuing a run whose stop saved none):
    training from step 0 instead would be the wrong run, silently."""
    (tmp_path / "parent" / "checkpoints").mkdir(parents=True)
    code, err = run_main(["train", "--synthetic", "--steps", "1", "--max-seq-len", "128", "--out", str(tmp_path / "run"),
                          "--resume-from", str(tmp_path / "parent" / "checkpoints")], capsys)  # fmt: skip
    assert code == 2 and f"--resume-from: no checkpoint in {tmp_path / 'parent' / 'checkpoints'} to start from" in err, err
    assert "Traceback" not in err
    assert not (tmp_path / "run" / "metrics.jsonl").exists() or "step" not in (tmp_path / "run" / "metrics.jsonl").read_text()


def test_the_trainer_ends_quickly_but_a_profiler_still_gets_its_file(tmp_path):
    # training.cli.exit_process skips the interpreter's teardown; cProfile writes at it.
    profile = tmp_path / "train.prof"
    done = subprocess.run([sys.executable, "-m", "cProfile", "-o", str(profile), "-m", "training", "train",
                           "--synthetic", "--steps", "2", "--max-seq-len", "128", "--out", str(tmp_path / "run")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert profile.stat().st_size > 0
