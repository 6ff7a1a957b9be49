"""A trained DFlash drafter as the directory speculators' DFlash loader reads
(`SpeculatorModel.from_pretrained`, speculators 0.9.0, model type "dflash"), which vLLM's
speculators format serves.

config.json
    speculators_model_type "dflash", architectures ["DFlashDraftModel"]; block_size;
    aux_hidden_state_layer_ids, the verifier layers the drafter reads, in the data's
    meaning (the residual stream entering decoder layer l, training/extract.py);
    mask_token_id; draft_vocab_size = the verifier's vocabulary (the drafter drafts over
    all of it: no d2t/t2d); sample_from_anchor false (the anchor is the verifier's token,
    offsets 1..block_size - 1 are drafted); transformer_layer_config, a Qwen3 layer config
    whose num_hidden_layers is the number of draft layers; speculators_config (greedy
    proposals of block_size - 1 tokens, the verifier's name where the data recorded one).
model.safetensors (bfloat16)
    fc.weight [H, n·H], hidden_norm.weight, layers.<i>.{input_layernorm,
    post_attention_layernorm}.weight, layers.<i>.self_attn.{q,k,v,o}_proj.weight,
    layers.<i>.self_attn.{q,k}_norm.weight, layers.<i>.mlp.{gate,up,down}_proj.weight,
    norm.weight. No embed_tokens or lm_head: the loader takes the verifier's, frozen, as
    the drafter trained with them.

The drafter's modules carry these names already (training/drafters/dflash/model.py), so the
weights are the checkpoint's own, cast.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

SPECULATORS_VERSION = "0.9.0"  # the release whose loader this layout was read from
# Every name a drafter of N layers exports, beside the per-layer ones below.
TOP_LEVEL = ("fc.weight", "hidden_norm.weight", "norm.weight")
PER_LAYER = ("input_layernorm.weight", "post_attention_layernorm.weight",
             "self_attn.q_proj.weight", "self_attn.k_proj.weight",
             "self_attn.v_proj.weight", "self_attn.o_proj.weight",
             "self_attn.q_norm.weight", "self_attn.k_norm.weight",
             "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")


def exported_names(num_layers: int) -> list[str]:
    return [*TOP_LEVEL, *(f"layers.{i}.{name}" for i in range(num_layers)
                          for name in PER_LAYER)]


def speculators_config(drafter: dict, target_layers: list[int], max_seq_len: int,
                       verifier: str | None) -> dict:
    """config.json for a DFlashConfig's dict (training/config.py)."""
    block = drafter["block_size"]
    layer = {
        "model_type": "qwen3", "hidden_size": drafter["hidden_size"],
        "intermediate_size": drafter["intermediate_size"],
        "num_hidden_layers": drafter["num_layers"],
        "num_attention_heads": drafter["num_heads"],
        "num_key_value_heads": drafter["num_kv_heads"], "head_dim": drafter["head_dim"],
        "hidden_act": "silu", "rms_norm_eps": drafter["rms_norm_eps"],
        "rope_parameters": {"rope_type": "default", "rope_theta": drafter["rope_theta"]},
        "max_position_embeddings": max(max_seq_len, 2048),
        "vocab_size": drafter["vocab_size"], "attention_bias": False,
        "tie_word_embeddings": False,
    }
    return {
        "speculators_model_type": "dflash", "speculators_version": SPECULATORS_VERSION,
        "architectures": ["DFlashDraftModel"],
        "block_size": block, "mask_token_id": drafter["mask_token_id"],
        "aux_hidden_state_layer_ids": list(target_layers),
        "draft_vocab_size": drafter["vocab_size"],
        "target_hidden_size": drafter["hidden_size"],
        "sample_from_anchor": False, "sliding_window_non_causal": False,
        "tie_word_embeddings": False, "dtype": "bfloat16",
        "transformer_layer_config": layer,
        "speculators_config": {
            "algorithm": "dflash",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": block - 1}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier or None, "architectures": []},
        },
    }


def export_dflash(checkpoint_dir: Path, out_dir: Path, verifier: str | None = None) -> Path:
    """Write out_dir from a DFlash run's checkpoint step directory. verifier: the
    verifier's hub id or path, for the loader to take its embedding and head from."""
    checkpoint_dir, out_dir = Path(checkpoint_dir), Path(out_dir)
    saved = json.loads((checkpoint_dir / "config.json").read_text())
    drafter, dflash = saved["drafter"], saved.get("dflash")
    if dflash is None:
        raise ValueError(f"{checkpoint_dir} is not a DFlash checkpoint")
    tensors = load_file(checkpoint_dir / "model.safetensors")
    names = exported_names(drafter["num_layers"])
    missing = sorted(set(names) - set(tensors))
    if missing:
        raise ValueError(f"{checkpoint_dir}: the checkpoint lacks {missing[:3]}")
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file({n: tensors[n].to(torch.bfloat16).contiguous() for n in names},
              out_dir / "model.safetensors")
    config = speculators_config(drafter, dflash["target_layers"], saved["max_seq_len"],
                                verifier)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out_dir
