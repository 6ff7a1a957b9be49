"""Soft cross-entropy over the draft vocabulary, a chunk of positions at a time.

The drafter's logits and the verifier's distribution are [positions x draft_vocab]; at
24K positions x 32K-248K entries the float32 softmaxes do not fit next to each other.
The verifier's distribution is computed once per batch and kept in the activations'
dtype (TTT step k scores position i against the verifier at i + k + 1, so every step
reads the same table, shifted). The drafter's side walks the positions in chunks and,
as the loss's gradient with respect to the logits is known as soon as they are
(softmax - target), takes the head's gradients in the same pass: each chunk's logits
are made once and used three times (loss, input gradient, weight gradient) instead of
being recomputed in backward, and the peak is set by the chunk size.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from training.compiled import cuda_compiled
from training.fp8 import input_grad


def _loss_dtype(dtype: torch.dtype) -> torch.dtype:
    # Softmaxes run in float32 for bf16 activations, in float64 for float64 ones.
    return torch.promote_types(dtype, torch.float32)


@dataclass
class Targets:
    """The verifier's distribution over the draft vocabulary at every position."""
    probs: Tensor  # [N, V] in the verifier hidden states' dtype
    argmax: Tensor  # [N] long


@cuda_compiled
def _target_chunk(logits: Tensor) -> tuple[Tensor, Tensor]:
    """The verifier's distribution (in the logits' dtype, softmax in float32) and argmax
    over a chunk of its logits: one read of them, where eager ran an fp32 copy, its
    argmax, its softmax and a cast."""
    z = logits.to(_loss_dtype(logits.dtype))
    return z.softmax(-1).to(logits.dtype), z.argmax(-1)


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
            # the matmul in the states' dtype (bf16 on GPU), as autocast would run it
            probs[s:s + chunk], argmax[s:s + chunk] = _target_chunk(
                target_hidden[s:s + chunk] @ tw.T)
    return Targets(probs, argmax)


def _chunk_losses(logits: Tensor, probs: Tensor, rows: Tensor,
                  want_grad: bool) -> tuple[Tensor, Tensor, Tensor | None]:
    """Each row's loss against probs[rows], its argmax and, if wanted, d loss / d logits =
    softmax(z) - q. On CUDA, training/drafters/eagle3/loss_triton.py does the same in one kernel."""
    z, q = logits.to(_loss_dtype(logits.dtype)), probs[rows].to(_loss_dtype(logits.dtype))
    lse = torch.logsumexp(z, -1, keepdim=True)
    grad = ((z - lse).exp() - q).to(logits.dtype) if want_grad else None
    # -sum(q * log_softmax(z)) = logsumexp(z) - sum(q * z), as q sums to 1.
    return lse.squeeze(-1) - (q * z).sum(-1), z.argmax(-1), grad


def _chunk_pass(logits: Tensor):
    if logits.is_cuda and logits.dtype != torch.float64:  # the kernel's sums are float32
        from training.drafters.eagle3 import loss_triton  # imports Triton, which CUDA machines have
        return loss_triton.chunk_losses
    return _chunk_losses


def _accumulate_product(acc: Tensor, a: Tensor, b: Tensor, first: bool) -> None:
    """acc = a @ b if first (acc's contents ignored: no zero fill to write and read back),
    else acc += a @ b. A wider acc than a and b is summed in the matmul itself on CUDA
    (out_dtype), not through a product in the narrow dtype and a second pass."""
    beta = 0 if first else 1
    if acc.dtype == a.dtype:
        torch.addmm(acc, a, b, beta=beta, out=acc)
    elif acc.is_cuda:
        torch.addmm(acc, a, b, beta=beta, out_dtype=acc.dtype, out=acc)
    else:  # no out_dtype kernel on the CPU
        torch.addmm(acc, a.to(acc.dtype), b.to(acc.dtype), beta=beta, out=acc)


class _HeadSoftCrossEntropy(torch.autograd.Function):
    """Σ over positions of the soft cross-entropy of (hidden @ weight.T) against the
    targets; forward also computes the gradients for an upstream gradient of 1, which
    backward scales."""

    @staticmethod
    def forward(ctx, hidden, weight, probs, target_rows, chunk, grad_enabled, weight_fp8):
        w = weight.to(hidden.dtype)
        want_hidden = grad_enabled and ctx.needs_input_grad[0]
        want_weight = grad_enabled and ctx.needs_input_grad[1]
        P = hidden.shape[0]
        losses = hidden.new_empty(P, dtype=_loss_dtype(hidden.dtype))
        logits_argmax = torch.empty(P, dtype=torch.long, device=hidden.device)
        grad_hidden = torch.empty_like(hidden) if want_hidden else None
        grad_weight = None
        if want_weight:  # the first chunk's product fills it; zeros only without a chunk
            make = torch.empty_like if P else torch.zeros_like
            grad_weight = make(weight, dtype=_loss_dtype(weight.dtype))
        chunk_pass = _chunk_pass(hidden)
        for s in range(0, P, chunk):
            c = slice(s, s + chunk)
            losses[c], logits_argmax[c], grad_logits = chunk_pass(
                hidden[c] @ w.T, probs, target_rows[c], want_hidden or want_weight)
            if grad_logits is None:
                continue
            if want_hidden:
                input_grad(grad_logits, w, weight_fp8, grad_hidden[c])
            if want_weight:
                _accumulate_product(grad_weight, grad_logits.T, hidden[c], first=s == 0)
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.weight_dtype = weight.dtype
        ctx.mark_non_differentiable(losses, logits_argmax)
        return losses.sum(), losses, logits_argmax

    @staticmethod
    def backward(ctx, grad_total, _grad_losses, _grad_argmax):
        grad_hidden, grad_weight = ctx.saved_tensors
        if grad_hidden is not None:
            grad_hidden = grad_hidden * grad_total.to(grad_hidden.dtype)
        if grad_weight is not None:
            grad_weight = (grad_weight * grad_total).to(ctx.weight_dtype)
        return grad_hidden, grad_weight, None, None, None, None, None


def soft_cross_entropy(hidden: Tensor, weight: Tensor, targets: Targets, target_rows: Tensor,
                       chunk: int = 2048, weight_fp8: tuple[Tensor, Tensor] | None = None
                       ) -> tuple[Tensor, Tensor, Tensor]:
    """Soft cross-entropy between the drafter's and the verifier's distributions.

    hidden [P, H] and weight [V, H] give the drafter's logits; position p is scored
    against row target_rows[p] of targets (verifier_targets). The loss equals the forward
    KL(target || drafter) plus the target's entropy, a constant, so both have the same
    gradient. Returns the sum over positions (differentiable: weigh it with a scalar),
    the per-position losses [P] (float32, or float64 for float64 inputs; not
    differentiable) and agree [P] bool (the two argmaxes coincide). Never holds more
    than a few chunk x V matrices besides the targets and the gradients it returns.
    weight_fp8: a frozen weight as fp8.frozen_to_fp8 makes it (`train --fp8`): the gradient
    for hidden is then an fp8 matmul; the logits stay in hidden's dtype.
    """
    if chunk <= 0:
        raise ValueError(f"loss chunk must be positive, got {chunk}")
    if targets.probs.requires_grad:
        raise ValueError("the target side of soft_cross_entropy takes no gradient")
    if weight_fp8 is not None and weight.requires_grad:
        raise ValueError("an fp8 copy of the head is for a frozen head: this one trains")
    with torch.autocast(hidden.device.type, enabled=False):
        total, losses, logits_argmax = _HeadSoftCrossEntropy.apply(
            hidden, weight, targets.probs, target_rows, chunk, torch.is_grad_enabled(),
            weight_fp8)
    return total, losses, logits_argmax == targets.argmax[target_rows]
