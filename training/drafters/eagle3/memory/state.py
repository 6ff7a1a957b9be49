"""EAGLE-3's own parameters: trainable, frozen and autocast-cached, and the verifier's frozen
tensors it holds."""
from __future__ import annotations

from training.config import DrafterConfig
from training.memory.units import BF16, INDEX


def parameter_counts(cfg: DrafterConfig, freeze_lm_head: bool = False) -> dict[str, int]:
    """Parameters of training/drafters/eagle3/model.py's Eagle3Drafter: trainable, frozen, and the autocast-cached
    (a frozen draft head is the verifier's target head itself: no parameter of its own)."""
    H, I, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    q, kv = cfg.num_heads * hd, cfg.num_kv_heads * hd
    layer_matmuls = (
        3 * H * H  # fc: the 3 captured layers → H
        + 2 * H * (q + 2 * kv)  # q, k, v projections of [embedding ; hidden]
        + q * H  # o_proj
        + 3 * H * I  # SwiGLU gate, up, down
    )
    lm_head = cfg.draft_vocab_size * H
    return {
        # + 4 RMSNorm weights
        "trainable": layer_matmuls + 4 * H + (0 if freeze_lm_head else lm_head),
        # Autocast caches a bf16 copy of each weight its matmuls read, for the whole
        # forward and backward; the loss casts lm_head itself (its workspace).
        "autocast_cached": layer_matmuls,
        # embedding, target head
        "frozen": (cfg.vocab_size + cfg.draft_vocab_size) * H,
    }


def frozen_bytes(cfg: DrafterConfig) -> int:
    """The verifier's embedding and draft-vocabulary head (in its extracted dtype, bf16;
    a frozen draft head is that head), and the d2t/t2d maps."""
    return parameter_counts(cfg)["frozen"] * BF16 + cfg.draft_vocab_size * INDEX \
        + cfg.vocab_size
