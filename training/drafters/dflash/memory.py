"""Peak memory of a DFlash training step (training/drafters/dflash), the largest max_anchors
and block size that fit a card, and a DFlash run's measured shape and peak.

A step drafts Q = max_anchors × block_size block positions per row over L = max_seq_len
context positions, through every draft layer at once (no unroll: each layer keeps its
activations until backward), then scores P = max_anchors × (block_size - 1) positions
with the verifier's frozen head, a loss chunk of positions at a time. Its peak comes in
one of three phases:
- ``loss_forward``: every layer's activations are held and the loss works on a chunk
  (loss_chunk_bytes: the chunk's logits, the verifier's too for the soft KL) beside the
  scored positions' hidden states, targets and their gradient (taken in forward).
  Unchunked (a chunk as large as P): the whole [positions × vocabulary] tensors at once.
- ``layer_backward``: backward's first moments: the activations still held, the gradient
  scattered back to every block position, the last layer's MLP gradients and its weight
  gradients.
- ``optimizer_step``: weights, gradients and AdamW state, the frozen verifier tensors.

Activations are counted as training/drafters/dflash/model.py keeps them under bf16 autocast with the
CUDA trainer's compiled norms (each keeps its input and 1/rms). One ``scale`` (fitted on a
measured peak, ``calibrate``) multiplies the terms that grow with the positions, so a
run's own peak corrects what the analytic terms miss.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from training.config import FLEX_BLOCK, DFlashConfig
from training.memory.measured import start_and_peak, start_config, trained_drafter
from training.memory.peak import DEFAULT_HEADROOM_GIB, Prediction, fits
from training.memory.state import check_precision_and_sharding, trained_state
from training.memory.units import BF16, FP32, GiB, INDEX, PRECISIONS
from training.params import anchor_room


@dataclass(frozen=True)
class DFlashShape:
    """What a DFlash step's memory depends on besides the drafter's shape (its block
    size is the config's)."""

    max_seq_len: int
    max_anchors: int
    soft_kl: float = 0.0
    batch_rows: int = 1
    loss_chunk: int = 2048
    precision: str = "bf16"
    world_size: int = 1
    sharding: str = "ddp"

    def __post_init__(self) -> None:
        for name in ("max_seq_len", "max_anchors", "batch_rows", "loss_chunk", "world_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not 0 <= self.soft_kl <= 1:
            raise ValueError(f"soft_kl must be in [0, 1], got {self.soft_kl!r}")
        check_precision_and_sharding(self.precision, self.sharding)


def parameter_counts(cfg: DFlashConfig) -> dict[str, int]:
    """The drafter's parameters: trainable (every matmul and norm; autocast caches a bf16
    copy of the matmuls' weights) and the verifier's frozen embedding and head."""
    H, I, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    q, kv = cfg.num_heads * d, cfg.num_kv_heads * d
    layer = 2 * H * q + 2 * H * kv + 3 * H * I
    matmuls = cfg.num_target_layers * H * H + cfg.num_layers * layer
    norms = 2 * H + cfg.num_layers * (2 * H + 2 * d)
    return {"trainable": matmuls + norms, "matmuls": matmuls,
            "layer": layer + 2 * H + 2 * d, "frozen": 2 * cfg.vocab_size * H}


def gathered_parameters(cfg: DFlashConfig) -> int:
    """Under FSDP (training/distributed.shard), the parameters whole at once: FSDP's root group
    (fc and the norms around the layers) for the whole step, and two layers — the one
    running and the next, whose gather FSDP2 issues early to overlap it, in forward and
    in backward."""
    counts = parameter_counts(cfg)
    layers = cfg.num_layers * counts["layer"]
    return counts["trainable"] - layers + min(2, cfg.num_layers) * counts["layer"]


def per_block_position(cfg: DFlashConfig, precision: str) -> dict[str, int]:
    """Bytes one block position keeps for backward in each draft layer."""
    a = PRECISIONS[precision]
    H, I = cfg.hidden_size, cfg.intermediate_size
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    return {
        "input_norm": H * a + FP32,  # its input (the residual) and 1/rms
        "q_proj_input": H * a,  # the normed stream
        "kv_input": H * a,  # its row of [context ; blocks], read by k_proj and v_proj
        "q": 2 * q * a + cfg.num_heads * FP32,  # q_norm's input and 1/rms, rotated q
        "k": 2 * kv * a + cfg.num_kv_heads * FP32,  # k_norm's input and 1/rms, rotated k
        "v": kv * a,
        "attention": q * a + cfg.num_heads * FP32,  # output (o_proj's input), log-sum-exp
        "post_norm": 2 * H * a + FP32,  # input, 1/rms, output (gate's and up's input)
        "mlp": 2 * I * a,  # gate and up (silu(gate)·up is recomputed in backward)
    }


def per_context_position(cfg: DFlashConfig, precision: str) -> dict[str, int]:
    """Bytes one context position keeps for backward in each draft layer: its keys and
    values (k_proj and v_proj read the context as well as the blocks)."""
    a = PRECISIONS[precision]
    H, kv = cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim
    return {"kv_input": H * a, "k": 2 * kv * a + cfg.num_kv_heads * FP32, "v": kv * a}


def phases(cfg: DFlashConfig, shape: DFlashShape) -> dict[str, dict[str, dict[str, int]]]:
    """Each phase's terms in bytes: ``constant`` (weights, optimizer state, the verifier's
    tensors) and ``positions`` (what grows with rows, anchors and blocks)."""
    a = PRECISIONS[shape.precision]
    H, V, N = cfg.hidden_size, cfg.vocab_size, cfg.num_layers
    B, L, A, bs = shape.batch_rows, shape.max_seq_len, shape.max_anchors, cfg.block_size
    Q, P = A * bs, A * (bs - 1)
    counts = parameter_counts(cfg)
    p = counts["trainable"]
    state = {**trained_state(p, gathered_parameters(cfg), shape.world_size, shape.sharding),
             "frozen": counts["frozen"] * BF16}
    if shape.precision == "bf16":
        state["autocast_weights"] = counts["matmuls"] * BF16

    d = cfg.head_dim
    padded = (Q % FLEX_BLOCK or (L + Q) % FLEX_BLOCK) and shape.precision == "bf16"
    held = {
        # ids, positions, doc ids, loss mask; the context layers and the final hidden state
        "batch": B * L * (3 * INDEX + 1 + (cfg.num_target_layers + 1) * H * a),
        # fc's output (hidden_norm's input) and the normed context every layer reads
        "context": B * L * (2 * H * a + FP32),
        "block_embeddings": B * Q * H * a,  # the first layer's input
        "rotary": B * (L + Q) * d * FP32,  # cos and sin of every key's position
        "layers_blocks": N * B * Q * sum(per_block_position(cfg, shape.precision).values()),
        "layers_context": N * B * L * sum(per_context_position(cfg, shape.precision).values()),
    }
    if padded:  # flex_attention pads q, k and v to whole blocks
        kv = cfg.num_kv_heads * d
        held["flex_padding"] = N * B * (Q * cfg.num_heads * d + 2 * (L + Q) * kv) * a
    # The scored positions: the final norm's input and 1/rms, the gradient the loss takes
    # in forward, indices, weights, losses, agreement.
    held["scored"] = B * P * (2 * H * a + FP32 + 6 * INDEX + 2 * FP32 + 1)
    chunk = min(shape.loss_chunk, B * P)
    loss = {
        "scored_hidden": B * P * H * a,  # normed drafter rows
        # the verifier's, gathered: its hidden states for the soft KL, else its tokens
        "verifier_rows": B * P * (H * a if shape.soft_kl else INDEX),
        "loss_chunk": loss_chunk_bytes(V, chunk, shape.precision, shape.soft_kl),
    }
    I = cfg.intermediate_size
    backward = {
        "grad_scored": B * P * H * a,  # the loss's gradient, scaled
        "grad_blocks": B * Q * H * (a + FP32),  # scattered back to every block position
        "mlp_backward": B * Q * 3 * I * a,  # gate's and up's gradients, silu(gate)·up
        "last_layer_grads": counts["layer"] * FP32,
    }
    return {
        "loss_forward": {"constant": state, "positions": {**held, **loss}},
        "layer_backward": {"constant": {**state, "last_layer_grads":
                                        backward.pop("last_layer_grads")},
                           "positions": {**held, **backward}},
    }


def loss_chunk_bytes(vocab_size: int, chunk: int, precision: str, soft_kl: float,
                     fused: bool = True) -> int:
    """What the chunked loss (training/drafters/dflash/loss.py) holds at once beyond its inputs
    and their gradient; with a chunk as large as the positions, the unchunked loss.
    fused (CUDA's Triton pass): the drafter's logits in the activations' dtype (the
    gradient is written over them) and, for the soft KL, the verifier's. Eager (CPU), as
    measured there (tests/training/test_dflash_memory.py): float32, the drafter's
    log-probabilities and a log-sum-exp temporary, or for the soft KL the drafter's and
    the verifier's log-probabilities and the verifier's probabilities."""
    if fused:
        per_entry = (2 if soft_kl else 1) * PRECISIONS[precision]
    else:
        per_entry = (3 if soft_kl else 2) * FP32
    return chunk * vocab_size * per_entry


def optimizer_phase(cfg: DFlashConfig, shape: DFlashShape) -> int:
    """Weights, gradients, AdamW state (fused: in place; under FSDP each a shard, the
    gathered weights freed after backward), the frozen tensors and the batch, which the
    loop still holds."""
    a = PRECISIONS[shape.precision]
    p = parameter_counts(cfg)["trainable"]
    batch = shape.batch_rows * shape.max_seq_len * (
        3 * INDEX + 1 + (cfg.num_target_layers + 1) * cfg.hidden_size * a)
    shard = shape.world_size if shape.sharding == "fsdp" else 1
    return 4 * p * FP32 // shard + parameter_counts(cfg)["frozen"] * BF16 + batch


def predict(cfg: DFlashConfig, shape: DFlashShape, scale: float = 1.0) -> Prediction:
    """The step's predicted peak; scale multiplies the terms that grow with positions."""
    scaled = {name: {"constant": dict(terms["constant"]),
                     "positions": {k: round(v * scale) for k, v in terms["positions"].items()}}
              for name, terms in phases(cfg, shape).items()}
    totals = {name: sum(sum(g.values()) for g in terms.values())
              for name, terms in scaled.items()}
    peak = max(totals, key=totals.get)
    return Prediction(scaled[peak], peak, totals[peak], optimizer_phase(cfg, shape), 0, 0)


def calibrate(cfg: DFlashConfig, shape: DFlashShape, peak_bytes: int) -> float:
    """The scale with which the prediction meets a measured forward+backward peak (its
    max_memory_allocated), refused beyond a factor of two: then the model does not
    describe that trainer."""
    constant = {name: sum(terms["constant"].values())
                for name, terms in phases(cfg, shape).items()}
    grows = {name: sum(terms["positions"].values())
             for name, terms in phases(cfg, shape).items()}
    peak = max(grows, key=lambda n: constant[n] + grows[n])
    scale = (peak_bytes - constant[peak]) / grows[peak]
    if not 0.5 <= scale <= 2:
        raise ValueError(f"a measured peak of {peak_bytes / 2**30:.2f} GiB does not fit the "
                         f"DFlash memory model (scale {scale:.2f})")
    return scale


def largest_max_anchors(cfg: DFlashConfig, shape: DFlashShape, gpu_mem_gib: float, *,
                        scale: float = 1.0, multiple: int = 64,
                        headroom_gib: float = DEFAULT_HEADROOM_GIB) -> int:
    """The largest max_anchors, a multiple of `multiple` (or the most a row holds,
    training.params.anchor_room), whose step fits; 0 if none does."""
    room = anchor_room(shape.max_seq_len, cfg.block_size)

    def fits_at(n: int) -> bool:
        at = dataclasses.replace(shape, max_anchors=n)
        return fits(predict(cfg, at, scale), gpu_mem_gib, headroom_gib)

    if room < 1:
        return 0
    if fits_at(room):
        return room
    lo, hi = 0, room // multiple + 1  # lo·multiple fits (or is none), hi·multiple does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits_at(mid * multiple) else (lo, mid)
    return lo * multiple


def largest_block_size(cfg: DFlashConfig, shape: DFlashShape, gpu_mem_gib: float, *,
                       scale: float = 1.0, headroom_gib: float = DEFAULT_HEADROOM_GIB,
                       most: int = 64) -> int:
    """The largest block size up to `most` (and the row) whose step fits at the shape's
    max_anchors; 0 if not even a block of 2 does."""
    best = 0
    for bs in range(2, min(most, shape.max_seq_len) + 1):
        if shape.max_anchors > anchor_room(shape.max_seq_len, bs):
            break
        if not fits(predict(dataclasses.replace(cfg, block_size=bs), shape, scale),
                    gpu_mem_gib, headroom_gib):
            break
        best = bs
    return best



def dflash_from_run(run_dir: str | Path) -> tuple[DFlashConfig, DFlashShape, int]:
    """The DFlash drafter, step shape and measured peak (bytes) of a finished run."""
    start, peak = start_and_peak(run_dir)
    if trained_drafter(start_config(start)) != "dflash":
        raise ValueError(f"{run_dir} trained an EAGLE-3 drafter, not DFlash")
    cfg, shape = shape_from_start(start)
    return cfg, shape, round(peak * GiB)


def shape_from_start(start: dict) -> tuple[DFlashConfig, DFlashShape]:
    """The DFlash drafter and step shape a run's `start` event describes (ValueError if it
    cannot be read, or the run did not train on a GPU)."""
    config = start_config(start)
    try:
        dflash = config["dflash"]
        cfg = DFlashConfig.from_dict(config["model"])
        return cfg, DFlashShape(max_seq_len=int(config["max_seq_len"]),
                                max_anchors=int(dflash["max_anchors"]),
                                soft_kl=float(dflash["soft_kl"]),
                                batch_rows=int(config.get("batch_rows", 1)),
                                loss_chunk=int(config.get("loss_chunk", 2048)),
                                precision=config.get("precision", "bf16"),
                                world_size=int(start.get("world_size", 1)),
                                sharding=config.get("sharding", "ddp"))
    except KeyError as e:
        raise ValueError(f"the start event's config lacks {e.args[0]}") from e
    except (TypeError, ValueError, AttributeError) as e:  # a field of another type than the trainer writes
        raise ValueError(f"the start event's config is not usable: {e}") from e
