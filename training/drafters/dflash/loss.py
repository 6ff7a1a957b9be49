"""DFlash's loss over the verifier's whole vocabulary, a chunk of positions at a time.

Each scored position p has the drafter's hidden state h_p and the verifier's final hidden
state t_p for the same token; both go through the verifier's frozen head. The loss is
(1 - W) · CE(drafter, the verifier's argmax) + W · KL(verifier || drafter), weighted per
position. At the story's 24,576 positions × 248,320 tokens one float32 logits tensor is
24 GB, so neither side's logits ever exist whole: each chunk makes both, takes the loss,
and, as d loss / d logits = softmax(z) - ((1 - W) · onehot(y) + W · q) is known at once,
the chunk's gradient for h in the same pass. The head is frozen: no weight gradient.
Without the KL the verifier's side is only its argmax token: verifier_tokens makes it once
per distinct position, and the chunks hold the drafter's logits alone.
"""
from __future__ import annotations

import torch
from torch import Tensor

from training.flex import at_least_float32
from training.fp8 import input_grad


def _row_dot(a: Tensor, b: Tensor) -> Tensor:
    """Σ_v a[p, v] · b[p, v] per row, as a batched matmul: no chunk × V product to hold."""
    return (a.unsqueeze(-2) @ b.unsqueeze(-1)).view(-1)


def _chunk(z: Tensor, target: Tensor, weights: Tensor, soft_kl: float,
           want_grad: bool) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """Per-row loss (float), drafter argmax, verifier argmax and, if wanted, weights · d
    loss / d z in z's dtype, for a chunk's drafter logits and the verifier's logits (the
    soft KL needs them) or token ids. Float copies are made and overwritten: at the
    story's vocabulary each chunk × V float tensor is 1 GB per 1,024 positions, and this
    holds three at most. On CUDA, training/drafters/dflash/loss_triton.py does the same in one
    kernel."""
    f = at_least_float32(z.dtype)
    logits = target.is_floating_point()
    mine, theirs = z.argmax(-1), target.argmax(-1) if logits else target
    log_p = z.to(f)
    log_p = log_p.sub_(log_p.logsumexp(-1, keepdim=True))
    loss = (soft_kl - 1) * log_p.gather(-1, theirs[:, None]).squeeze(-1)
    if soft_kl:
        log_q = target.to(f)
        log_q = log_q.sub_(log_q.logsumexp(-1, keepdim=True))
        q = log_q.exp()
        loss = loss + soft_kl * (_row_dot(q, log_q) - _row_dot(q, log_p))  # KL(q || p)
    if not want_grad:
        return loss, mine, theirs, None
    grad = log_p.exp_().scatter_add_(-1, theirs[:, None],
                                     loss.new_full((loss.shape[0], 1), soft_kl - 1))
    if soft_kl:
        grad.sub_(q, alpha=soft_kl)
    return loss, mine, theirs, grad.mul_(weights[:, None].to(f)).to(z.dtype)


def _chunk_pass(hidden: Tensor):
    if hidden.is_cuda and hidden.dtype != torch.float64:  # the kernel's sums are float32
        from training.drafters.dflash import loss_triton  # imports Triton, which CUDA machines have
        return loss_triton.chunk_pass
    return _chunk


@torch.no_grad()
def verifier_tokens(final_hidden: Tensor, rows: tuple[Tensor, Tensor], head: Tensor,
                    dtype: torch.dtype, chunk: int = 2048) -> Tensor:
    """The verifier's token (its argmax) at rows of final_hidden [N, H], given as
    torch.unique(rows, return_inverse=True) gives them (the distinct rows, and where each
    row is among them): each distinct row is computed once, as blocks overlap and the rows
    the loss scores repeat (at the story's shape three times over). The logits are made in
    dtype, as block_loss makes them."""
    if chunk <= 0:
        raise ValueError(f"loss chunk must be positive, got {chunk}")
    distinct, where = rows
    w = head.to(dtype)
    tokens = torch.empty(distinct.shape[0], dtype=torch.long, device=final_hidden.device)
    with torch.autocast(final_hidden.device.type, enabled=False):
        for s in range(0, distinct.shape[0], chunk):
            states = final_hidden.index_select(0, distinct[s:s + chunk]).to(dtype)
            tokens[s:s + chunk] = (states @ w.T).argmax(-1)
    return tokens[where]


class _BlockLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, head, target, weights, soft_kl, chunk, grad_enabled, head_fp8):
        f = at_least_float32(hidden.dtype)
        w = head.to(hidden.dtype)
        want_grad = grad_enabled and ctx.needs_input_grad[0]
        P = hidden.shape[0]
        losses = hidden.new_empty(P, dtype=f)
        agree = torch.empty(P, dtype=torch.bool, device=hidden.device)
        grad_hidden = torch.empty_like(hidden) if want_grad else None
        chunk_pass = _chunk_pass(hidden)
        states = target.is_floating_point()
        for s in range(0, P, chunk):
            c = slice(s, s + chunk)
            theirs = target[c].to(hidden.dtype) @ w.T if states else target[c]
            losses[c], mine, theirs, grad_z = chunk_pass(hidden[c] @ w.T, theirs, weights[c],
                                                         soft_kl, want_grad)
            agree[c] = mine == theirs
            if want_grad:
                input_grad(grad_z, w, head_fp8, grad_hidden[c])
            del grad_z  # before the next chunk's logits are made
        ctx.save_for_backward(grad_hidden)
        ctx.mark_non_differentiable(losses, agree)
        return (losses * weights.to(f)).sum(), losses, agree

    @staticmethod
    def backward(ctx, grad_total, _grad_losses, _grad_agree):
        (grad_hidden,) = ctx.saved_tensors
        if grad_hidden is not None:
            grad_hidden = grad_hidden * grad_total.to(grad_hidden.dtype)
        return grad_hidden, None, None, None, None, None, None, None


def block_loss(hidden: Tensor, head: Tensor, target: Tensor, weights: Tensor,
               soft_kl: float = 0.0, chunk: int = 2048,
               head_fp8: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """hidden [P, H] (the drafter's, after its final norm) through head [V, H], scored
    against the verifier at the same positions: its final hidden states target [P, H]
    (through the same head), or, without the soft KL, its tokens target [P] (long; what
    verifier_tokens makes, the verifier's logits never made here).

    Returns Σ_p weights[p] · loss_p (differentiable in hidden), the losses [P] (float32,
    float64 for float64 inputs; not differentiable) and agree [P] (the drafter's argmax
    is the verifier's). Never holds more than a few chunk × V matrices. head_fp8: the
    head as fp8.frozen_to_fp8 makes it (`train --fp8`): the gradient for hidden is then an
    fp8 matmul; the logits stay in hidden's dtype.
    """
    if chunk <= 0:
        raise ValueError(f"loss chunk must be positive, got {chunk}")
    if not 0 <= soft_kl <= 1:
        raise ValueError(f"soft_kl must be in [0, 1], got {soft_kl}")
    if head.requires_grad:
        raise ValueError("the verifier's head is frozen: block_loss takes no gradient for it")
    if soft_kl and not target.is_floating_point():
        raise ValueError("the soft KL needs the verifier's hidden states, not its tokens")
    with torch.autocast(hidden.device.type, enabled=False):
        return _BlockLoss.apply(hidden, head, target, weights, float(soft_kl), chunk,
                                torch.is_grad_enabled(), head_fp8)
