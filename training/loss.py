"""Soft cross-entropy over the draft vocabulary, a chunk of positions at a time.

The drafter's logits and the verifier's distribution are [positions x draft_vocab]; at
24K positions x 32K-248K entries the float32 softmaxes do not fit next to each other.
The verifier's distribution is computed once per batch and kept in the activations'
dtype (TTT step k scores position i against the verifier at i + k + 1, so every step
reads the same table, shifted); the drafter's side walks the positions in chunks and
recomputes each chunk's logits in backward, so its peak is set by the chunk size.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from training.compiled import cuda_compiled


def _loss_dtype(dtype: torch.dtype) -> torch.dtype:
    # Softmaxes run in float32 for bf16 activations, in float64 for float64 ones.
    return torch.promote_types(dtype, torch.float32)


def _logits(hidden: Tensor, weight: Tensor) -> Tensor:
    # The matmul runs in the activations' dtype (bf16 on GPU), as autocast would.
    return (hidden @ weight.T).to(_loss_dtype(hidden.dtype))


@dataclass
class Targets:
    """The verifier's distribution over the draft vocabulary at every position."""
    probs: Tensor  # [N, V] in the verifier hidden states' dtype
    argmax: Tensor  # [N] long


@torch.no_grad()
def verifier_targets(target_hidden: Tensor, target_weight: Tensor,
                     chunk: int = 2048) -> Targets:
    """softmax(target_hidden @ target_weight.T) for [N, H'] states, chunk rows at a time."""
    if chunk <= 0:
        raise ValueError(f"loss chunk must be positive, got {chunk}")
    with torch.autocast(target_hidden.device.type, enabled=False):
        tw = target_weight.to(target_hidden.dtype)
        N, V = target_hidden.shape[0], tw.shape[0]
        probs = target_hidden.new_empty(N, V)
        argmax = torch.empty(N, dtype=torch.long, device=target_hidden.device)
        for s in range(0, N, chunk):
            logits = _logits(target_hidden[s:s + chunk], tw)
            argmax[s:s + chunk] = logits.argmax(-1)
            probs[s:s + chunk] = logits.softmax(-1)
    return Targets(probs, argmax)


@cuda_compiled
def _chunk_losses(logits: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    z, q = logits.to(_loss_dtype(logits.dtype)), target.to(_loss_dtype(logits.dtype))
    # -sum(q * log_softmax(z)) = logsumexp(z) - sum(q * z), as q sums to 1.
    return torch.logsumexp(z, -1) - (q * z).sum(-1), z.argmax(-1)


@cuda_compiled
def _chunk_grad_logits(logits: Tensor, target: Tensor, grad_losses: Tensor) -> Tensor:
    # d loss / d logits = softmax(z) - q
    z = logits.to(_loss_dtype(logits.dtype))
    return ((z.softmax(-1) - target) * grad_losses[:, None]).to(logits.dtype)


class _ChunkedSoftCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, probs, target_rows, chunk):
        w = weight.to(hidden.dtype)
        dtype = _loss_dtype(hidden.dtype)
        losses = hidden.new_empty(hidden.shape[0], dtype=dtype)
        logits_argmax = torch.empty(hidden.shape[0], dtype=torch.long, device=hidden.device)
        for s in range(0, hidden.shape[0], chunk):
            c = slice(s, s + chunk)
            losses[c], logits_argmax[c] = _chunk_losses(hidden[c] @ w.T,
                                                        probs[target_rows[c]])
        ctx.save_for_backward(hidden, weight, probs, target_rows)
        ctx.chunk = chunk
        ctx.mark_non_differentiable(logits_argmax)
        return losses, logits_argmax

    @staticmethod
    def backward(ctx, grad_losses, _grad_argmax):
        hidden, weight, probs, target_rows = ctx.saved_tensors
        w = weight.to(hidden.dtype)
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight, dtype=_loss_dtype(weight.dtype)) \
            if ctx.needs_input_grad[1] else None
        for s in range(0, hidden.shape[0], ctx.chunk):
            c = slice(s, s + ctx.chunk)
            grad_logits = _chunk_grad_logits(hidden[c] @ w.T, probs[target_rows[c]],
                                             grad_losses[c])
            if grad_hidden is not None:
                grad_hidden[c] = grad_logits @ w
            if grad_weight is not None:
                grad_weight += grad_logits.T @ hidden[c]
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None


def soft_cross_entropy(hidden: Tensor, weight: Tensor, targets: Targets, target_rows: Tensor,
                       chunk: int = 2048) -> tuple[Tensor, Tensor]:
    """Per-position soft cross-entropy between the drafter's and the verifier's
    distributions.

    hidden [P, H] and weight [V, H] give the drafter's logits; position p is scored
    against row target_rows[p] of targets (verifier_targets). The loss equals the forward
    KL(target || drafter) plus the target's entropy, a constant, so both have the same
    gradient. Returns losses [P] (float32, or float64 for float64 inputs) and agree [P]
    bool (the two argmaxes coincide). Never holds more than a few chunk x V matrices
    besides the targets.
    """
    if chunk <= 0:
        raise ValueError(f"loss chunk must be positive, got {chunk}")
    if targets.probs.requires_grad:
        raise ValueError("the target side of soft_cross_entropy takes no gradient")
    with torch.autocast(hidden.device.type, enabled=False):
        losses, logits_argmax = _ChunkedSoftCrossEntropy.apply(
            hidden, weight, targets.probs, target_rows, chunk)
    return losses, logits_argmax == targets.argmax[target_rows]
