"""The analytic terms: the bytes a training step keeps, by phase and by how they grow.

Each term is what EAGLE-3's model.py, attention.py and loss.py keep for backward or what
training/loop.py allocates; the package docstring (training/drafters/eagle3/memory/__init__.py) says
how the phases and groups are chosen.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from training.config import FLEX_BLOCK, DrafterConfig
from training.drafters.eagle3.memory.state import frozen_bytes, parameter_counts
from training.memory.state import check_precision_and_sharding, trained_state
from training.memory.units import BF16, FP32, INDEX, PRECISIONS

GROUPS = ("constant", "per_token", "per_step", "diagonal")
PHASES = ("loss_forward", "loss_backward", "norm_backward", "attention_backward",
          "fold_backward", "fold_backward_pending")


@dataclass(frozen=True)
class StepShape:
    """What a training step's memory depends on besides the drafter's shape."""

    max_seq_len: int
    ttt_steps: int
    batch_rows: int = 1
    loss_chunk: int = 2048
    precision: str = "bf16"
    world_size: int = 1
    sharding: str = "ddp"
    checkpoint_ttt: int = 0  # train --checkpoint-ttt N: the first N TTT steps recomputed
    freeze_lm_head: bool = False  # train --freeze-lm-head: the draft head takes no gradient
    # train --offload-saved: what the recomputed steps and the loss keep for backward, and
    # AdamW's state between steps, wait in pinned host memory (training/offload.py)
    offload_saved: bool = False

    def __post_init__(self) -> None:
        for name in ("max_seq_len", "ttt_steps", "batch_rows", "loss_chunk", "world_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        # A count only: a manifest's or start event's legacy true/false is read as one by
        # training.params.count_recomputed before it gets here.
        if isinstance(self.checkpoint_ttt, bool) or not isinstance(self.checkpoint_ttt, int) \
                or self.checkpoint_ttt < 0:
            raise ValueError("checkpoint_ttt counts TTT steps (0 or more), "
                             f"got {self.checkpoint_ttt!r}")
        check_precision_and_sharding(self.precision, self.sharding)

    @property
    def tokens(self) -> int:
        return self.batch_rows * self.max_seq_len


def _compiled(precision: str) -> bool:
    # bf16 is the CUDA trainer, whose norms and SwiGLU are compiled (training/compiled.py):
    # AOTAutograd keeps fewer tensors than the eager CPU path; its loss chunks are a Triton
    # kernel (training/drafters/eagle3/loss_triton.py) with no temporaries of its own.
    return precision == "bf16"


def _norm_saved(H: int, precision: str, input_bytes: int | None = None) -> int:
    """RMSNorm of a grad-requiring input. Eager: its fp32 copy (read by pow), 1/rms and
    the normalised fp32 input (read by the weight's gradient). Compiled: the input as it
    comes (activation dtype unless input_bytes says otherwise) and 1/rms."""
    if _compiled(precision):
        return H * (input_bytes or PRECISIONS[precision]) + FP32
    return 2 * H * FP32 + FP32


def saved_per_token_step(cfg: DrafterConfig, precision: str,
                         padded: bool = False) -> dict[str, int]:
    """Bytes one token keeps for backward in every TTT step, by what keeps them.

    padded: rows that are not whole flex_attention blocks, so attention pads copies of
    q, k and v (the CPU's dense attention is not modelled: memory matters on GPUs).
    """
    a = PRECISIONS[precision]
    H, I, D = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    q, kv = cfg.num_heads * D, cfg.num_kv_heads * D
    compiled = _compiled(precision)
    return {
        # norm(embedding): the embedding (frozen, cast to the activation dtype) takes no
        # gradient. Eager keeps the normalised fp32 input; compiled keeps the cast
        # embedding itself and 1/rms.
        "embed_norm": H * a + FP32 if compiled else H * FP32,
        "hidden_norm": _norm_saved(H, precision),
        "qkv_inputs": 2 * H * a,  # [norm(embedding) ; norm(hidden)], shared by q, k, v
        "rope_cos_sin": 2 * (D // 2) * FP32,  # cos and sin, one pair for q and k
        # this step's rotated k and v: the next steps attend to them
        "kv": 2 * kv * a,
        # flex_attention keeps q, its output and log-sum-exp (k and v are the ones above,
        # unless the row is padded to whole blocks: then its keys are a padded copy)
        "flex_attention": (2 * q + (2 * kv if padded else 0)) * a + cfg.num_heads * FP32,
        "o_proj_input": q * a,
        "post_attn_norm": _norm_saved(H, precision) + H * a,  # + its output, for gate and up
        # gate and up (SwiGLUDown recomputes silu(gate)·up in backward)
        "mlp": 2 * I * a,
        # the loss on this step's positions: final norm of the gathered hidden, the
        # gradient of the normed hidden (taken in forward, kept for backward), the
        # positions' (step, row, column) index (every step's in one tensor), per-position
        # losses and agreement
        "loss_inputs": _norm_saved(H, precision) + H * a + 3 * INDEX + FP32 + 1,
    }


def saved_per_token_later_step(cfg: DrafterConfig, precision: str,
                               padded: bool = False) -> dict[str, int]:
    """Extra bytes in steps 1..K-1, which fold their diagonal keys into flex's output
    (attention.with_diagonal_keys): the fold keeps the fp32 softmax weight of flex's output
    per query head, and q, the one flex keeps, unless the row is padded to whole blocks:
    then flex keeps a padded copy and q is kept besides."""
    q = cfg.num_heads * cfg.head_dim
    return {"fold_out_weight": cfg.num_heads * FP32,
            "unpadded_q": q * PRECISIONS[precision] if padded else 0}


def saved_per_token_diag(cfg: DrafterConfig, precision: str) -> dict[str, int]:
    """Bytes per token for each diagonal key of a step (Σ_k k = K(K-1)/2 of them over the
    unroll): the fold keeps its fp32 softmax weight per query head. The keys and values
    are each step's own, counted there."""
    return {"diagonal_weights": cfg.num_heads * FP32}


def kept_per_token_checkpointed_step(cfg: DrafterConfig, precision: str) -> dict[str, int]:
    """What a TTT step keeps under --checkpoint-ttt: the layer's outputs and inputs, and
    the loss, which runs outside the checkpoint (it keeps gradients, not inputs)."""
    a = PRECISIONS[precision]
    H, kv = cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim
    return {
        "hidden": H * a,  # the next step's input
        "kv": 2 * kv * a,  # the later steps attend to them
        "tokens_positions": 2 * INDEX,  # the step's inputs, rebuilt per step
        "loss_inputs": saved_per_token_step(cfg, precision)["loss_inputs"],
    }


def saved_per_token(cfg: DrafterConfig, precision: str) -> dict[str, int]:
    """Bytes per token independent of the TTT depth, held from forward to the optimizer."""
    a = PRECISIONS[precision]
    H = cfg.hidden_size
    return {
        # the packed batch on the device, hidden states in the activation dtype (as
        # extracted: bf16 on GPU): aux [3H] (which fc keeps as its input), final [H]; ids,
        # positions, doc ids, loss mask
        "batch": 4 * H * a + 3 * INDEX + 1,
        "doc_ids_copy": INDEX,  # the block mask's own copy of the sample ids
        # the verifier's distribution over the draft vocabulary and its argmax, made once
        # per batch (loss.verifier_targets)
        "verifier_targets": cfg.draft_vocab_size * a + INDEX,
    }


def backward_per_token(cfg: DrafterConfig, precision: str) -> dict[str, dict[str, int]]:
    """Bytes per token that backward adds in its first moments, by phase (none forward).

    The loss's backward writes the gradient of its input (the normed hidden). Eager, the
    final norm's backward then holds, beside that gradient, three fp32 [T, H] tensors (the
    incoming gradient cast up, the normalised input's gradient, the product the weight's
    gradient is summed from), while the loss's saved normed hidden and (then) verifier
    hidden of the last step are already freed: H200 slopes at TTT 1 agreed, +10·H bytes
    per token over the loss's backward, for both recorded drafter shapes. Compiled, the
    norm's backward is one kernel whose [T, H] output takes the place of the freed input.
    """
    a = PRECISIONS[precision]
    H = cfg.hidden_size
    loss_grad = {"loss_input_grad": H * a}
    norm = {} if _compiled(precision) else {"norm_backward_fp32": 3 * H * FP32 - 2 * H * a}
    return {"loss_forward": {},
            "loss_backward": loss_grad,
            "norm_backward": {**loss_grad, **norm}}


def loss_workspace(cfg: DrafterConfig, shape: StepShape) -> dict[str, dict[str, int]]:
    """The chunked loss at work, by phase (bytes independent of the positions).

    Every TTT step's draft-head gradient is taken in its forward, in fp32, and waits for
    backward (``lm_head_step_grads``, K of them until the last step's backward has scaled
    its own into lm_head's .grad). Forward, the last step's loss works with the draft head
    cast to the activation dtype (the verifier's head was cast once, for the targets, and
    freed) and per chunk the logits and the logits' gradient (CUDA: both in the
    activation dtype, the verifier's probabilities read in place; eager fp32: with the
    gathered probabilities and one more fp32 temporary). Backward only scales the kept
    gradients: the head's, scaled, is a new [V, H] fp32 matrix that becomes lm_head's
    .grad.
    """
    a = PRECISIONS[shape.precision]
    chunk = min(shape.loss_chunk, shape.tokens)
    V, H, K = cfg.draft_vocab_size, cfg.hidden_size, shape.ttt_steps
    # A trained head is fp32, a frozen one the verifier's bf16 head: a copy in the
    # activations' dtype where they differ.
    casts = {"loss_head_casts": V * H * a} if a != (BF16 if shape.freeze_lm_head else FP32) \
        else {}
    forward = chunk * V * (2 * a if _compiled(shape.precision) else 4 * FP32)
    if shape.freeze_lm_head:  # no gradients for the head at all
        return {"loss_forward": {**casts, "loss_chunk": forward},
                "loss_backward": {}, "norm_backward": {}}
    kept = V * H * FP32
    return {
        "loss_forward": {**casts, "lm_head_step_grads": K * kept, "loss_chunk": forward},
        "loss_backward": {"lm_head_step_grads": K * kept, "lm_head_grad": kept},
        "norm_backward": {"lm_head_step_grads": (K - 1) * kept, "lm_head_grad": kept},
    }


def analytic_phases(cfg: DrafterConfig, shape: StepShape
                    ) -> dict[str, dict[str, dict[str, int]]]:
    """Each forward+backward phase's terms in bytes, grouped by how they grow."""
    counts = parameter_counts(cfg, shape.freeze_lm_head)
    p = counts["trainable"]
    # EAGLE-3's one layer is in FSDP's root group (training/drafters/eagle3.py): every trained
    # parameter is gathered for the whole step.
    state = {**trained_state(p, p, shape.world_size, shape.sharding),
             "frozen": frozen_bytes(cfg)}
    if shape.precision == "bf16":
        state["autocast_weights"] = counts["autocast_cached"] * BF16
    T, K = shape.tokens, shape.ttt_steps
    per_token = {k: v * T for k, v in saved_per_token(cfg, shape.precision).items()}
    padded = shape.max_seq_len % FLEX_BLOCK != 0
    step = saved_per_token_step(cfg, shape.precision, padded)
    later = {k: v for k, v in saved_per_token_later_step(cfg, shape.precision, padded).items()
             if v}
    diag = saved_per_token_diag(cfg, shape.precision)
    recomputed: dict[str, dict[str, int]] = {"per_token": {}, "per_step": {}}
    n = min(shape.checkpoint_ttt, K)  # the first n steps are recomputed
    if n == K:
        # Every step keeps its inputs and outputs, but no step reads the last one's keys
        # and values. The last step is recomputed when backward reaches its layer, so
        # only the attention backward holds what an uncheckpointed step keeps, its own
        # keys and values among them, and the weights of its K - 1 diagonal keys, counted
        # with the steps (∝ T·K).
        per_step = {f"kept_{k}": v * T * (K - 1 if k == "kv" else K)
                    for k, v in kept_per_token_checkpointed_step(cfg, shape.precision).items()}
        recomputed["per_step"] = {f"recomputed_diag_{k}": v * T * (K - 1)
                                  for k, v in diag.items()}
        recomputed["per_token"] = {f"recomputed_step_{k}": v * T for k, v in step.items()
                                   if k != "loss_inputs"}
        if K > 1:
            recomputed["per_token"].update(
                {f"recomputed_later_step_{k}": v * T for k, v in later.items()})
        diagonal = {}
    else:
        # Steps n..K-1 keep everything; backward frees them before it recomputes steps
        # 0..n-1, which until then keep their inputs and outputs. Step k > 0 also keeps
        # the weights of its k diagonal keys.
        full = K - n
        per_step = {f"step_{k}": v * T * full for k, v in step.items()}
        per_step.update({f"later_step_{k}": v * T * (full if n else K - 1)
                         for k, v in later.items()})
        if n:
            per_step.update({f"kept_{k}": v * T * n for k, v in
                             kept_per_token_checkpointed_step(cfg, shape.precision).items()})
        pairs = (K * (K - 1) - n * (n - 1)) // 2  # Σ k over the steps that keep everything
        diagonal = {k: v * T * pairs for k, v in diag.items()}
    workspace = loss_workspace(cfg, shape)
    backward = backward_per_token(cfg, shape.precision)
    phases = {phase: {"constant": {**state, **workspace[phase]},
                      "per_token": {**per_token,
                                    **{k: v * T for k, v in backward[phase].items()}},
                      "per_step": dict(per_step), "diagonal": dict(diagonal)}
              for phase in PHASES[:3]}
    phases["attention_backward"] = _attention_backward(
        cfg, shape, state, {**per_token, **recomputed["per_token"]},
        {**per_step, **recomputed["per_step"]}, diagonal, step)
    if K > 1:
        phases["fold_backward"] = _fold_backward(cfg, shape, phases["attention_backward"],
                                                 K - 1)
    if K > 2 and n == K:
        phases["fold_backward_pending"] = _fold_backward(
            cfg, shape, phases["attention_backward"], K - 2)
    if shape.offload_saved:
        for phase in phases.values():
            _offloaded(phase, cfg, shape)
    return phases


# What --offload-saved moves off the device: the kept terms of the recomputed steps that
# wait there from forward to backward, and AdamW's state between steps. The keys and
# values stay: the last step attends to every earlier one in forward, and its recompute
# brings them all back for its backward, the peak.
OFFLOADED_KEPT = ("kept_loss_inputs", "kept_hidden")


def host_terms(cfg: DrafterConfig, shape: StepShape) -> dict[str, int]:
    """Pinned host memory --offload-saved holds through a step (training/offload.py): a
    copy of everything the recomputed steps and the loss keep for backward, the keys and
    values too, and AdamW's two moments. Empty without the option."""
    if not shape.offload_saved:
        return {}
    phases = analytic_phases(cfg, dataclasses.replace(shape, offload_saved=False))
    kept = phases["attention_backward"]["per_step"]
    host = {k: v for k, v in kept.items() if k.startswith("kept_") and v >= 0}
    host["adamw_state"] = phases["attention_backward"]["constant"].get("adamw_state", 0)
    return host


def _offloaded(phase: dict[str, dict[str, int]], cfg: DrafterConfig, shape: StepShape) -> None:
    """One phase's device terms under --offload-saved, in place."""
    phase["constant"].pop("adamw_state", None)
    kept = phase["per_step"]
    moved = [kept.pop(k) for k in OFFLOADED_KEPT if k in kept]
    if moved and shape.checkpoint_ttt >= shape.ttt_steps:
        # the last step's loss inputs, counted as freed from the kept ones, were not there
        kept.pop("freed_last_step", None)
    if moved:
        # the recomputed step's input, back on the device for its backward
        kept["recomputed_input_hidden"] = cfg.hidden_size * PRECISIONS[shape.precision] \
            * shape.tokens


def _attention_backward(cfg: DrafterConfig, shape: StepShape, state: dict, per_token: dict,
                        per_step: dict, diagonal: dict, step: dict) -> dict:
    """The last step's attention backward: its MLP, norms, o_proj and loss inputs are
    freed, the layer's weight gradients exist, and the keys and values of every step take
    gradients at once (the last step attends to all of them). Under --checkpoint-ttt,
    where each step keeps little, this is the peak."""
    a = PRECISIONS[shape.precision]
    H, I = cfg.hidden_size, cfg.intermediate_size
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    T, K = shape.tokens, shape.ttt_steps
    freed = ("mlp", "post_attn_norm", "loss_inputs", "o_proj_input")
    if shape.checkpoint_ttt >= K:
        per_token = {k: v for k, v in per_token.items()
                     if k.removeprefix("recomputed_step_") not in freed}
        # the last step's loss, outside the checkpoint, has done its backward
        per_step = {**per_step, "freed_last_step": -step["loss_inputs"] * T}
    else:  # the last of the K steps counted in per_step
        per_step = {**per_step, "freed_last_step": -sum(step[k] for k in freed) * T}
    head = cfg.draft_vocab_size * H * FP32
    head_grads = {} if shape.freeze_lm_head else {"lm_head_step_grads": (K - 1) * head,
                                                  "lm_head_grad": head}
    return {
        "constant": {**state, **head_grads, "mlp_o_proj_grads": (3 * H * I + q * H) * FP32},
        "per_token": {**per_token, "attention_input_grads": (q + 2 * kv + H) * a * T},
        "per_step": {**per_step, "kv_grads": 2 * kv * a * T * K},
        "diagonal": dict(diagonal),
    }


def _fold_backward(cfg: DrafterConfig, shape: StepShape, attention: dict, j: int) -> dict:
    """Step j's diagonal-key fold backward (attention._DiagonalFold; j diagonal keys), just
    before its flex backward, from the last step's attention backward (`attention`, j =
    K - 1): of the keys' and values' gradients only step j's j diagonal ones (flex's come
    after), beside the fold's stacked copies of those keys and values (a pass's inputs,
    freed after it); its gradients for q, flex's output and log-sum-exp and the
    gradients arriving (o_proj's input's, the residual's) in place of the projections'
    input gradients. The verifier's targets are freed with the forward: the loss took its
    gradients there.

    Every step recomputed, an earlier step (j < K - 1) holds what its backward keeps
    (j steps' keys and values, j steps' loss inputs, j + 1 hidden states) and, still
    pending, the last step's keys' and values' gradients (the fold's stack of them stays
    whole until the last of them is used): the second-last step's fold is the peak, by
    more with --offload-saved, where the kept terms freed meanwhile were on the host."""
    a = PRECISIONS[shape.precision]
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    H, T, K = cfg.hidden_size, shape.tokens, shape.ttt_steps
    per_token = {k: v for k, v in attention["per_token"].items()
                 if k not in ("attention_input_grads", "verifier_targets")}
    per_token["fold_input_grads"] = (2 * q * a + cfg.num_heads * FP32) * T
    per_token["fold_arriving_grads"] = (q + H) * a * T
    per_step = {k: v for k, v in attention["per_step"].items() if k != "kv_grads"}
    per_step["fold_kv_grads"] = per_step["fold_stacks"] = 2 * kv * a * T * j
    if j < K - 1:
        per_step["pending_kv_grads"] = 2 * kv * a * T * K
        kept = kept_per_token_checkpointed_step(cfg, shape.precision)
        per_step.update(kept_kv=kept["kv"] * T * j, kept_hidden=kept["hidden"] * T * (j + 1),
                        kept_loss_inputs=kept["loss_inputs"] * T * j,
                        kept_tokens_positions=kept["tokens_positions"] * T * (j + 1))
        per_step.pop("freed_last_step", None)
    return {"constant": dict(attention["constant"]), "per_token": per_token,
            "per_step": per_step, "diagonal": dict(attention["diagonal"])}


def optimizer_phase(cfg: DrafterConfig, shape: StepShape) -> int:
    """Peak of the optimizer step: weights, gradients, AdamW state (fused AdamW works in
    place; under FSDP each a shard, the gathered weights freed after backward), the
    frozen tensors and the batch, which is still referenced."""
    p = parameter_counts(cfg, shape.freeze_lm_head)["trainable"]
    shard = shape.world_size if shape.sharding == "fsdp" else 1
    batch = saved_per_token(cfg, shape.precision)["batch"] * shape.tokens
    return frozen_bytes(cfg) + 4 * p * FP32 // shard + batch


def group_totals(cfg: DrafterConfig, shape: StepShape) -> list[list[int]]:
    """Bytes per [phase][group] (PHASES × GROUPS), unscaled."""
    phases = analytic_phases(cfg, shape)
    # a step of one TTT step has no diagonal keys, so no fold backward
    return [[sum(phases[p][g].values()) if p in phases else 0 for g in GROUPS] for p in PHASES]
