"""DFlash's loss over the verifier's whole vocabulary, a chunk of positions at a time.

Each scored position p has the drafter's hidden state h_p and the verifier's final hidden
state t_p for the same token; both go through the verifier's frozen head. The loss is
(1 - W) · CE(drafter, the verifier's argmax) + W · KL(verifier || drafter), weighted per
position. At the story's 24,576 positions × 248,320 tokens one float32 logits tensor is
24 GB, so neither side's logits ever exist whole: each chunk makes both, takes the loss,
and, as d loss / d logits = softmax(z) - ((1 - W) · onehot(y) + W · q) is known at once,
the chunk's gradient for h in the same pass. The head is frozen: no weight gradient.
"""
from __future__ import annotations

import torch
from torch import Tensor

from training.attention import at_least_float32


def _row_dot(a: Tensor, b: Tensor) -> Tensor:
    """Σ_v a[p, v] · b[p, v] per row, as a batched matmul: no chunk × V product to hold."""
    return (a.unsqueeze(-2) @ b.unsqueeze(-1)).view(-1)


def _chunk(z: Tensor, target_logits: Tensor, soft_kl: float
           ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-row loss, drafter argmax, verifier argmax and d loss / d z (float), for fresh
    float logits of both sides, which it overwrites: at the story's vocabulary each chunk ×
    V tensor is 1 GB per 1,024 positions, and this holds three at most."""
    mine, theirs = z.argmax(-1), target_logits.argmax(-1)
    log_p = z.sub_(z.logsumexp(-1, keepdim=True))
    loss = (soft_kl - 1) * log_p.gather(-1, theirs[:, None]).squeeze(-1)
    if soft_kl:
        log_q = target_logits.sub_(target_logits.logsumexp(-1, keepdim=True))
        q = log_q.exp()
        loss = loss + soft_kl * (_row_dot(q, log_q) - _row_dot(q, log_p))  # KL(q || p)
    grad = log_p.exp_().scatter_add_(-1, theirs[:, None],
                                     loss.new_full((loss.shape[0], 1), soft_kl - 1))
    if soft_kl:
        grad.sub_(q, alpha=soft_kl)
    return loss, mine, theirs, grad


class _BlockLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, head, target_hidden, weights, soft_kl, chunk, grad_enabled):
        f = at_least_float32(hidden.dtype)
        w = head.to(hidden.dtype)
        want_grad = grad_enabled and ctx.needs_input_grad[0]
        P = hidden.shape[0]
        losses = hidden.new_empty(P, dtype=f)
        agree = torch.empty(P, dtype=torch.bool, device=hidden.device)
        grad_hidden = torch.empty_like(hidden) if want_grad else None
        for s in range(0, P, chunk):
            c = slice(s, s + chunk)
            target_logits = (target_hidden[c].to(hidden.dtype) @ w.T).to(f)
            losses[c], mine, theirs, grad_z = _chunk((hidden[c] @ w.T).to(f),
                                                     target_logits, soft_kl)
            agree[c] = mine == theirs
            if want_grad:
                grad_z = grad_z.mul_(weights[c, None].to(f)).to(hidden.dtype)
                torch.mm(grad_z, w, out=grad_hidden[c])
        ctx.save_for_backward(grad_hidden)
        ctx.mark_non_differentiable(losses, agree)
        return (losses * weights.to(f)).sum(), losses, agree

    @staticmethod
    def backward(ctx, grad_total, _grad_losses, _grad_agree):
        (grad_hidden,) = ctx.saved_tensors
        if grad_hidden is not None:
            grad_hidden = grad_hidden * grad_total.to(grad_hidden.dtype)
        return grad_hidden, None, None, None, None, None, None


def block_loss(hidden: Tensor, head: Tensor, target_hidden: Tensor, weights: Tensor,
               soft_kl: float = 0.0, chunk: int = 2048) -> tuple[Tensor, Tensor, Tensor]:
    """hidden [P, H] (the drafter's, after its final norm) and target_hidden [P, H] (the
    verifier's final hidden states at the same positions) through head [V, H].

    Returns Σ_p weights[p] · loss_p (differentiable in hidden), the losses [P] (float32,
    float64 for float64 inputs; not differentiable) and agree [P] (the drafter's argmax
    is the verifier's). Never holds more than a few chunk × V matrices.
    """
    if chunk <= 0:
        raise ValueError(f"loss chunk must be positive, got {chunk}")
    if not 0 <= soft_kl <= 1:
        raise ValueError(f"soft_kl must be in [0, 1], got {soft_kl}")
    if head.requires_grad:
        raise ValueError("the verifier's head is frozen: block_loss takes no gradient for it")
    with torch.autocast(hidden.device.type, enabled=False):
        return _BlockLoss.apply(hidden, head, target_hidden, weights, float(soft_kl), chunk,
                                torch.is_grad_enabled())
