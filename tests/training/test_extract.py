"""`trackside extract` on a tiny randomly initialised Llama made here: what it stores is
what a direct forward pass of each sample alone computes, and it resumes."""
from __future__ import annotations

import json
import re

import pytest
import torch
from safetensors.torch import load_file

from training.cli import main
from training.data import Dataset, sample_path
from training.extract import token_budget_batches

transformers = pytest.importorskip("transformers")

LENGTHS = [5, 17, 9, 33, 12, 3, 21]


@pytest.fixture(scope="module")
def verifier(tmp_path_factory):
    config = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=8, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=97, max_position_embeddings=128,
        tie_word_embeddings=False)
    torch.manual_seed(1)
    model = transformers.LlamaForCausalLM(config).eval()
    path = tmp_path_factory.mktemp("verifier")
    model.save_pretrained(path)
    return model, path


@pytest.fixture
def prompts(tmp_path):
    g = torch.Generator().manual_seed(2)
    path = tmp_path / "prompts.jsonl"
    lines = []
    for n in LENGTHS:
        ids = torch.randint(97, (n,), generator=g).tolist()
        lines.append(json.dumps({"input_ids": ids, "loss_mask": [i >= 2 for i in range(n)]}))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_stored_hidden_states_equal_a_direct_forward_pass(verifier, prompts, tmp_path,
                                                          capsys):
    model, model_dir = verifier
    out = tmp_path / "data"
    # A 40-token budget forces several padded batches of different widths.
    assert main(["extract", "--model", str(model_dir), "--prompts", str(prompts),
                 "--out", str(out), "--max-tokens-per-batch", "40"]) == 0
    progress = [line for line in capsys.readouterr().out.splitlines()
                if re.match(r"extract: \d+/\d+", line)]
    assert len(progress) > 3 and progress[-1].startswith(f"extract: {len(LENGTHS)}/")

    data = Dataset(out)
    assert data.info["layers"] == [2, 4, 5]  # EAGLE-3's default: 2, n // 2, n - 3
    assert data.lengths == LENGTHS and data.info["total_tokens"] == sum(LENGTHS)
    records = [json.loads(line) for line in prompts.read_text().splitlines()]
    for i, record in enumerate(records):
        sample = data[i]
        ids = torch.tensor(record["input_ids"])
        with torch.no_grad():
            states = model(ids[None], output_hidden_states=True).hidden_states
        layers = data.info["layers"]
        expected_aux = torch.cat([states[layer][0] for layer in layers], dim=-1)
        assert torch.equal(sample["input_ids"], ids)
        assert sample["loss_mask"].tolist() == record["loss_mask"]
        torch.testing.assert_close(sample["aux_hidden"], expected_aux, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(sample["final_hidden"], states[-1][0], atol=1e-5,
                                   rtol=1e-5)
    verifier_weights = data.verifier()
    assert torch.equal(verifier_weights["lm_head"], model.lm_head.weight)
    assert torch.equal(verifier_weights["embed_tokens"], model.model.embed_tokens.weight)
    counts = data.token_counts()
    expected = torch.zeros(97, dtype=torch.long)
    for record in records:
        for t, m in zip(record["input_ids"], record["loss_mask"]):
            expected[t] += m
    assert torch.equal(counts, expected)


def test_extraction_resumes_where_it_stopped(verifier, prompts, tmp_path, capsys):
    _, model_dir = verifier
    out = tmp_path / "data"
    argv = ["extract", "--model", str(model_dir), "--prompts", str(prompts), "--out",
            str(out), "--layers", "1,2,4"]
    assert main(argv) == 0
    kept = load_file(sample_path(out, 0))
    sample_path(out, 3).unlink()
    (out / "dataset.json").unlink()
    mtimes = {i: sample_path(out, i).stat().st_mtime_ns for i in range(len(LENGTHS)) if i != 3}
    capsys.readouterr()
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"extract: {len(LENGTHS) - 1}/{len(LENGTHS)} (resumed)"
    assert sample_path(out, 3).exists()
    assert mtimes == {i: sample_path(out, i).stat().st_mtime_ns for i in mtimes}
    assert Dataset(out).info["layers"] == [1, 2, 4]
    assert torch.equal(load_file(sample_path(out, 0))["aux_hidden"], kept["aux_hidden"])


def test_a_config_json_makes_a_random_verifier(prompts, tmp_path):
    config = {"model_type": "llama", "hidden_size": 16, "intermediate_size": 32,
              "num_hidden_layers": 7, "num_attention_heads": 2, "num_key_value_heads": 1,
              "vocab_size": 97}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert main(["extract", "--model", str(tmp_path / "config.json"), "--prompts",
                 str(prompts), "--out", str(tmp_path / "data")]) == 0
    data = Dataset(tmp_path / "data")
    assert data.hidden_size == 16 and data.info["layers"] == [2, 3, 4]
    assert data[0]["aux_hidden"].shape == (LENGTHS[0], 3 * 16)


@pytest.mark.parametrize("budget", [1, 30, 1000])
def test_token_budget_batches_never_exceed_the_budget(budget):
    batches = token_budget_batches(LENGTHS, budget)
    assert sorted(i for b in batches for i in b) == list(range(len(LENGTHS)))
    for batch in batches:
        width = max(LENGTHS[i] for i in batch)
        assert len(batch) == 1 or len(batch) * width <= budget
