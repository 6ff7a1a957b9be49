"""Soft cross-entropy over the draft vocabulary, a chunk of positions at a time.

The drafter's logits and the verifier's distribution are [positions x draft_vocab]; at
24K positions x 32K-248K entries they do not fit next to each other. Forward and backward
both walk the positions in chunks and recompute each chunk's logits, so the peak memory
is set by the chunk size, not by the number of positions.
"""
from __future__ import annotations

import torch
from torch import Tensor


def _chunk_logits(hidden: Tensor, weight: Tensor, target_hidden: Tensor,
                  target_weight: Tensor) -> tuple[Tensor, Tensor]:
    # Matmuls run in the activations' dtype (bf16 on GPU); softmaxes in at least float32.
    dtype = _loss_dtype(hidden)
    logits = (hidden @ weight.to(hidden.dtype).T).to(dtype)
    target_logits = (target_hidden @ target_weight.to(target_hidden.dtype).T).to(dtype)
    return logits, target_logits


def _loss_dtype(hidden: Tensor) -> torch.dtype:
    return torch.promote_types(hidden.dtype, torch.float32)


class _ChunkedSoftCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, target_hidden, target_weight, chunk):
        losses = hidden.new_empty(hidden.shape[0], dtype=_loss_dtype(hidden))
        agree = torch.empty(hidden.shape[0], dtype=torch.bool, device=hidden.device)
        for s in range(0, hidden.shape[0], chunk):
            c = slice(s, s + chunk)
            logits, target_logits = _chunk_logits(hidden[c], weight, target_hidden[c],
                                                  target_weight)
            target = torch.softmax(target_logits, dim=-1)
            losses[c] = -(target * torch.log_softmax(logits, dim=-1)).sum(-1)
            agree[c] = logits.argmax(-1) == target_logits.argmax(-1)
        ctx.save_for_backward(hidden, weight, target_hidden, target_weight)
        ctx.chunk = chunk
        ctx.mark_non_differentiable(agree)
        return losses, agree

    @staticmethod
    def backward(ctx, grad_losses, _grad_agree):
        hidden, weight, target_hidden, target_weight = ctx.saved_tensors
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight, dtype=_loss_dtype(weight)) \
            if ctx.needs_input_grad[1] else None
        for s in range(0, hidden.shape[0], ctx.chunk):
            c = slice(s, s + ctx.chunk)
            logits, target_logits = _chunk_logits(hidden[c], weight, target_hidden[c],
                                                  target_weight)
            # d/dlogits of -sum(q * log_softmax(z)) is softmax(z) - q, as q sums to 1.
            grad_logits = torch.softmax(logits, -1).sub_(torch.softmax(target_logits, -1))
            grad_logits = grad_logits.mul_(grad_losses[c, None]).to(hidden.dtype)
            del logits, target_logits
            if grad_hidden is not None:
                grad_hidden[c] = grad_logits @ weight.to(hidden.dtype)
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
    float64 inputs) and agree [P]
    bool (the two argmaxes coincide). Never holds more than chunk x V logits at once.
    """
    if chunk <= 0:
        raise ValueError(f"loss chunk must be positive, got {chunk}")
    if target_hidden.requires_grad or target_weight.requires_grad:
        raise ValueError("the target side of soft_cross_entropy takes no gradient")
    with torch.autocast(hidden.device.type, enabled=False):
        return _ChunkedSoftCrossEntropy.apply(hidden, weight, target_hidden, target_weight,
                                              chunk)
