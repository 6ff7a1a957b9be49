"""A trained drafter as a directory that speculative-decoding servers load.

The layout is the original EAGLE-3 one (yuhuili/EAGLE3-LLaMA3.1-Instruct-8B), which
SGLang's `LlamaForCausalLMEagle3` and vLLM's `Eagle3LlamaForCausalLM` both read:

config.json
    architectures ["LlamaForCausalLMEagle3"], model_type "llama", num_hidden_layers 1,
    hidden_size, intermediate_size, num_attention_heads, num_key_value_heads, head_dim,
    hidden_act "silu", rms_norm_eps, rope_theta, max_position_embeddings,
    vocab_size (the verifier's), draft_vocab_size, target_hidden_size,
    tie_word_embeddings false, torch_dtype "bfloat16",
    norm_before_residual false (the residual is the fused hidden before hidden_norm, as in
    EAGLE-3; vLLM's speculators format defaults it to true, so it is spelled out).
    eagle_aux_hidden_state_layer_ids only when the capture layers differ from the default
    (2, n//2, n-3), in vLLM's meaning: the input of decoder layer l. (SGLang adds one to
    the ids it is given; with the default layers both servers agree, so the key is left
    out.)
model.safetensors (bfloat16 weights; d2t int64, t2d bool)
    fc.weight [H, 3H], midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}
    .weight, midlayer.self_attn.{q,k,v}_proj.weight (input 2H), midlayer.self_attn.o_proj
    .weight, midlayer.mlp.{gate,up,down}_proj.weight, norm.weight, lm_head.weight
    [draft_vocab, H], d2t [draft_vocab] in the offset convention target_id = i + d2t[i],
    t2d [vocab] bool. No embed_tokens: the servers share the verifier's.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def export_drafter(checkpoint_dir: Path, out_dir: Path) -> Path:
    checkpoint_dir, out_dir = Path(checkpoint_dir), Path(out_dir)
    tensors = load_file(checkpoint_dir / "model.safetensors")
    saved = json.loads((checkpoint_dir / "config.json").read_text())
    drafter, layers = saved["drafter"], saved["layers"]

    weights = {name: t.to(torch.bfloat16) for name, t in tensors.items()
               if name not in ("d2t", "t2d")}
    d2t = tensors["d2t"].long()
    weights["d2t"] = d2t - torch.arange(d2t.shape[0])
    weights["t2d"] = tensors["t2d"].bool()

    H = drafter["hidden_size"]
    config = {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
        "num_hidden_layers": 1, "hidden_size": H,
        "intermediate_size": drafter["intermediate_size"],
        "num_attention_heads": drafter["num_heads"],
        "num_key_value_heads": drafter["num_kv_heads"], "head_dim": drafter["head_dim"],
        "hidden_act": "silu", "rms_norm_eps": drafter["rms_norm_eps"],
        "rope_theta": drafter["rope_theta"],
        "max_position_embeddings": max(saved["max_seq_len"], 2048),
        "vocab_size": drafter["vocab_size"], "draft_vocab_size": drafter["draft_vocab_size"],
        "target_hidden_size": H, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "norm_before_residual": False,
    }
    # The default capture layers need the verifier's depth, which the data recorded.
    if saved.get("num_layers") is None or layers != [2, saved["num_layers"] // 2,
                                                     saved["num_layers"] - 3]:
        config["eagle_aux_hidden_state_layer_ids"] = layers

    out_dir.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in weights.items()}, out_dir / "model.safetensors")
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out_dir
