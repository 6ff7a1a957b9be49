"""What one rank holds of a drafter's trained parameters through a step: their weights
and AdamW state, whole (DDP) or sharded (FSDP), either drafter."""
from __future__ import annotations

from training.memory.units import FP32, PRECISIONS

SHARDINGS = ("ddp", "fsdp")


def check_precision_and_sharding(precision: str, sharding: str) -> None:
    """A drafter shape's precision and sharding, as every drafter's memory model takes them."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if sharding not in SHARDINGS:
        raise ValueError(f"sharding must be one of {', '.join(SHARDINGS)}, got {sharding!r}")


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
