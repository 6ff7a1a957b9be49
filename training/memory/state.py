"""What one rank holds of the drafter itself through a step: its trained parameters and
their AdamW state (whole or sharded), and the verifier's frozen tensors."""
from __future__ import annotations

from training.config import DrafterConfig
from training.memory.units import BF16, FP32, INDEX


def trained_state(trainable: int, gathered: int, world_size: int, sharding: str
                  ) -> dict[str, int]:
    """What one rank holds of the trained parameters through a step, either drafter.

    DDP: the fp32 weights and AdamW's two fp32 moments whole, and at a world size above
    one its gradient buckets beside .grad. FSDP (training/distributed.shard): a 1/world_size
    shard of the weights and moments, and `gathered` parameters whole at once, in fp32
    (autocast casts them, as under DDP), from their group's forward to its backward —
    at a world size of one too: FSDP2 gathers into buffers of its own even then."""
    if sharding == "fsdp":
        return {"weights": trainable * FP32 // world_size,
                "adamw_state": 2 * trainable * FP32 // world_size,
                "fsdp_gathered": gathered * FP32}
    state = {"weights": trainable * FP32, "adamw_state": 2 * trainable * FP32}
    if world_size > 1:
        state["ddp_buckets"] = trainable * FP32
    return state


def parameter_counts(cfg: DrafterConfig, freeze_lm_head: bool = False) -> dict[str, int]:
    """Parameters of model.py's Eagle3Drafter: trainable, frozen, and the autocast-cached
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
