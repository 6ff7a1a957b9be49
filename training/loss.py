"""Soft cross-entropy over the draft vocabulary, a chunk of positions at a time.

The drafter's logits and the verifier's distribution are [positions x draft_vocab]; at
24K positions x 32K-248K entries they do not fit next to each other. Forward and backward
both walk the positions in chunks and recompute each chunk's logits, so the peak memory
is set by the chunk size, not by the number of positions.
"""
from __future__ import annotations

import torch
from torch import Tensor


def _loss_dtype(dtype: torch.dtype) -> torch.dtype:
    # Softmaxes run in float32 for bf16 activations, in float64 for float64 ones.
    return torch.promote_types(dtype, torch.float32)


def _logits(hidden: Tensor, weight: Tensor) -> Tensor:
    # The matmul runs in the activations' dtype (bf16 on GPU), as autocast would.
    return (hidden @ weight.T).to(_loss_dtype(hidden.dtype))


class _ChunkedSoftCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, target_hidden, target_weight, chunk):
        w = weight.to(hidden.dtype)
        tw = target_weight.to(target_hidden.dtype)
        losses = hidden.new_empty(hidden.shape[0], dtype=_loss_dtype(hidden.dtype))
        agree = torch.empty(hidden.shape[0], dtype=torch.bool, device=hidden.device)
        for s in range(0, hidden.shape[0], chunk):
            c = slice(s, s + chunk)
            logits = _logits(hidden[c], w)
            target = _logits(target_hidden[c], tw)
            agree[c] = logits.argmax(-1) == target.argmax(-1)
            target = target.softmax(-1)
            # -sum(q * log_softmax(z)) = logsumexp(z) - sum(q * z), as q sums to 1.
            losses[c] = torch.logsumexp(logits, -1) - (target * logits).sum(-1)
        ctx.save_for_backward(hidden, weight, target_hidden, target_weight)
        ctx.chunk = chunk
        ctx.mark_non_differentiable(agree)
        return losses, agree

    @staticmethod
    def backward(ctx, grad_losses, _grad_agree):
        hidden, weight, target_hidden, target_weight = ctx.saved_tensors
        w = weight.to(hidden.dtype)
        tw = target_weight.to(target_hidden.dtype)
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight, dtype=_loss_dtype(weight.dtype)) \
            if ctx.needs_input_grad[1] else None
        for s in range(0, hidden.shape[0], ctx.chunk):
            c = slice(s, s + ctx.chunk)
            # d loss / d logits = softmax(z) - q
            grad_logits = _logits(hidden[c], w).softmax(-1)
            grad_logits -= _logits(target_hidden[c], tw).softmax(-1)
            grad_logits = (grad_logits * grad_losses[c, None]).to(hidden.dtype)
            if grad_hidden is not None:
                grad_hidden[c] = grad_logits @ w
            if grad_weight is not None:
                grad_weight += grad_logits.T @ hidden[c]
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None


def soft_cross_entropy(hidden: Tensor, weight: Tensor, target_hidden: Tensor,
                       target_weight: Tensor, chunk: int = 2048) -> tuple[Tensor, Tensor]:
    """Per-position soft cross-entropy between two heads' distributions.

    hidden [P, H] and weight [V, H] give the drafter's logits; target_hidden [P, H'] and
    target_weight [V, H'] give the verifier's (no gradient flows to the target side).
    The loss equals the forward KL(target || drafter) plus the target's entropy, a
    constant, so both have the same gradient. Returns losses [P] (float32, or float64 for
    float64 inputs) and agree [P] bool (the two argmaxes coincide). Never holds more
    than a few chunk x V matrices at once.
    """
    if chunk <= 0:
        raise ValueError(f"loss chunk must be positive, got {chunk}")
    if target_hidden.requires_grad or target_weight.requires_grad:
        raise ValueError("the target side of soft_cross_entropy takes no gradient")
    with torch.autocast(hidden.device.type, enabled=False):
        return _ChunkedSoftCrossEntropy.apply(hidden, weight, target_hidden, target_weight,
                                              chunk)
