"""`trackside train --drafter dflash` refuses what it cannot train (exit 2, naming the
flag) and EAGLE-3's TTT flags; `trackside extract --drafter dflash` captures DFlash's
five layers by default."""
from __future__ import annotations

import json

import pytest
import torch

from training.cli import main
from training.extract import default_layers, extract


def run(args, tmp_path):
    try:
        return main(["train", "--synthetic", "--drafter", "dflash", "--out",
                     str(tmp_path / "run"), *args])
    except SystemExit as exc:  # argparse's own refusals
        return exc.code


@pytest.mark.parametrize("args, flag, why", [
    # the synthetic samples are 48-160 tokens: no block of 200 fits in one
    (["--block-size", "200"], "--block-size", "longest sample"),
    # a row of 128 holds at most 128 - 8 + 1 blocks of 8
    (["--max-seq-len", "128", "--block-size", "8", "--max-anchors", "122"], "--max-anchors",
     "at most 121"),
])
def test_blocks_and_anchors_beyond_what_the_rows_hold_exit_2(args, flag, why, capsys, cache,
                                                              tmp_path):
    assert run(args, tmp_path) == 2
    err = capsys.readouterr().err
    assert flag in err and why in err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.parametrize("args, named", [
    (["--ttt-steps", "5"], ["--ttt-steps"]),
    (["--ttt-decay", "0.5"], ["--ttt-decay"]),
    (["--ttt-steps", "5", "--ttt-decay", "0.5", "--checkpoint-ttt"],
     ["--ttt-steps", "--ttt-decay", "--checkpoint-ttt"]),
])
def test_ttt_flags_are_refused_for_dflash_naming_each(args, named, capsys, cache, tmp_path):
    assert run(args, tmp_path) == 2
    err = capsys.readouterr().err
    assert all(flag in err for flag in named) and "--drafter dflash" in err


def test_the_largest_anchor_count_a_row_holds_trains(cache, tmp_path):
    assert run(["--max-seq-len", "128", "--block-size", "8", "--max-anchors", "121",
                "--steps", "1"], tmp_path) == 0


@pytest.mark.parametrize("num_layers, layers", [
    (36, [1, 9, 17, 25, 33]),  # Qwen3-8B
    (61, [1, 15, 29, 44, 58]),  # the story's verifier
    (10, [1, 3, 4, 5, 7]),
    (5, [1, 2]),  # too shallow for five distinct layers
])
def test_dflash_default_layers_spread_over_the_depth(num_layers, layers):
    assert default_layers(num_layers, "dflash") == layers
    assert default_layers(num_layers) == [2, num_layers // 2, num_layers - 3]


def test_extract_for_dflash_captures_five_layers_by_default(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    verifier = LlamaForCausalLM(LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=10, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=100)).eval()
    samples = [(list(range(1, n + 1)), [True] * n) for n in (12, 20)]
    info = extract(verifier, samples, tmp_path / "data", log=lambda line: None,
                   drafter="dflash")
    assert info["layers"] == [1, 3, 4, 5, 7]
    assert json.loads((tmp_path / "data" / "dataset.json").read_text())["layers"] == \
        [1, 3, 4, 5, 7]
