"""`train --drafter dflash --export DIR`: the layout speculators 0.9.0's DFlash loader
reads, checked against names read from its source and, where speculators imports, by
loading the export with it and comparing its forward with the drafter's own."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from training.cli import main
from training.config import DFLASH_PRESETS
from training.drafters.dflash.export import export_dflash
from training.drafters.dflash.model import DFlashDrafter
from training.packing import PackedBatch

# Read from speculators 0.9.0 (speculators/models/dflash/core.py and model_definitions.py:
# the modules DFlashDraftModel builds, and what its save_pretrained writes for a drafter
# of two layers whose vocabulary is the verifier's, so that embed_tokens, lm_head and
# verifier_lm_head are left out).
SPECULATORS_NAMES = {
    "fc.weight", "hidden_norm.weight", "norm.weight",
    *(f"layers.{i}.{name}" for i in range(2) for name in (
        "input_layernorm.weight", "post_attention_layernorm.weight",
        "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
        "self_attn.o_proj.weight", "self_attn.q_norm.weight", "self_attn.k_norm.weight",
        "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")),
}
# The config fields its DFlashSpeculatorConfig reads (speculators/models/dflash/config.py)
SPECULATORS_CONFIG_KEYS = {"speculators_model_type", "architectures",
                           "transformer_layer_config", "draft_vocab_size", "block_size",
                           "target_hidden_size", "aux_hidden_state_layer_ids",
                           "mask_token_id", "sample_from_anchor", "speculators_config"}


def checkpoint_of(drafter: DFlashDrafter, root: Path, target_layers) -> Path:
    """A step directory as the trainer writes one: the drafter's parameters and config."""
    step = root / "step-1"
    step.mkdir(parents=True)
    save_file({n: p.detach().contiguous() for n, p in drafter.named_parameters()},
              step / "model.safetensors")
    (step / "config.json").write_text(json.dumps({
        "drafter": drafter.cfg.to_dict(), "max_seq_len": 256,
        "dflash": {"target_layers": list(target_layers), "max_anchors": 8, "gamma": 7.0,
                   "soft_kl": 0.0}}))
    return step


def test_train_export_writes_speculators_names_and_config(cache, tmp_path):
    out = tmp_path / "export"
    assert main(["train", "--synthetic", "--drafter", "dflash", "--steps", "1",
                 "--num-layers", "2", "--max-seq-len", "128", "--max-anchors", "4",
                 "--out", str(tmp_path / "run"), "--export", str(out)]) == 0
    assert set(load_file(out / "model.safetensors")) == SPECULATORS_NAMES
    assert all(t.dtype == torch.bfloat16 for t in load_file(out / "model.safetensors").values())
    config = json.loads((out / "config.json").read_text())
    assert SPECULATORS_CONFIG_KEYS <= set(config)
    tiny = DFLASH_PRESETS["tiny"]
    assert config["speculators_model_type"] == "dflash"
    assert config["block_size"] == tiny.block_size
    assert config["mask_token_id"] == tiny.mask_token_id
    data = json.loads((tmp_path / "run" / "data" / "dataset.json").read_text())
    assert config["aux_hidden_state_layer_ids"] == data["layers"]
    assert config["transformer_layer_config"]["num_hidden_layers"] == 2
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == \
        tiny.block_size - 1


def test_export_refuses_an_eagle3_checkpoint(tmp_path):
    step = tmp_path / "step-1"
    step.mkdir()
    (step / "config.json").write_text(json.dumps({"drafter": {}, "max_seq_len": 8}))
    with pytest.raises(ValueError, match="not a DFlash checkpoint"):
        export_dflash(step, tmp_path / "out")


def test_speculators_loads_the_export_and_drafts_as_the_drafter_does(tmp_path, monkeypatch):
    pytest.importorskip("pydantic_settings")
    core = pytest.importorskip("speculators.models.dflash.core")
    from speculators.models.dflash import DFlashSpeculatorConfig

    torch.manual_seed(0)
    cfg = DFLASH_PRESETS["tiny"]
    drafter = DFlashDrafter(cfg).double()
    for p in drafter.parameters():  # norms away from 1, so a misplaced one shows
        if p.dim() == 1:
            p.data.uniform_(0.5, 1.5)
    V, H = cfg.vocab_size, cfg.hidden_size
    embed, head = torch.randn(V, H, dtype=torch.float64), torch.randn(V, H, dtype=torch.float64)
    drafter.load_verifier(embed, head)
    out = export_dflash(checkpoint_of(drafter.float(), tmp_path, [1, 3, 5]), tmp_path / "out")
    # the export is bf16: the drafter takes the rounded weights, so both models hold the same
    exported = load_file(out / "model.safetensors")
    drafter.double().load_state_dict({n: t.double() for n, t in exported.items()},
                                     strict=False)

    config = DFlashSpeculatorConfig.from_pretrained(out)
    config.transformer_layer_config._attn_implementation = "eager"  # CPU: no flex backward
    model = core.DFlashDraftModel.from_pretrained(out, config=config).double().eval()
    with torch.no_grad():  # the verifier's, which a server shares (no verifier to load here)
        model.embed_tokens.weight.copy_(embed)
        model.lm_head.weight.copy_(head)
        model.verifier_lm_head.weight.copy_(head)

    # One row of two samples; both models draft the same blocks.
    L, bs, A = 64, cfg.block_size, 5
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, V - 1, (1, L), generator=g)
    doc = (torch.arange(L) >= 40).long()[None]
    pos = torch.cat([torch.arange(40), torch.arange(24)])[None]
    aux = torch.randn(1, L, 3 * H, dtype=torch.float64, generator=g)
    final = torch.randn(1, L, H, dtype=torch.float64, generator=g)
    anchors = torch.tensor([[2, 9, 20, 41, 50]])
    monkeypatch.setattr(core, "select_anchors",
                        lambda *a, **k: (anchors[0], torch.ones(A, dtype=torch.bool)))
    monkeypatch.setattr("training.drafters.dflash.model.sample_anchors",
                        lambda *a, **k: (anchors, torch.ones(1, A, dtype=torch.bool)))
    theirs, *_ = model._backbone_forward(aux, ids, torch.ones(1, L), final, doc, pos,
                                         max_anchors=A)

    ours = {}
    drafter.norm.register_forward_hook(lambda m, i, o: ours.setdefault("h", o))
    batch = PackedBatch(ids, pos, doc, torch.ones(1, L, dtype=torch.bool), aux, final,
                        num_samples=2, num_truncated=0, pad_tokens=0)
    with torch.no_grad():
        drafter(batch, aux, A, gamma=7.0)
    # ours holds the drafted offsets 1..bs-1 of each block, in slot order
    drafted = torch.arange(A * bs).view(A, bs)[:, 1:].flatten()
    # (speculators makes its rotary tables in float32: ~1e-7 apart, not 1e-15)
    torch.testing.assert_close(ours["h"], theirs[0, drafted], rtol=1e-5, atol=1e-5)
