"""DFlash's per-chunk loss pass (training/drafters/dflash/loss.py `_chunk`) as one Triton kernel.

Eager, the pass is a dozen full sweeps over float32 copies of the [chunk x vocab] logits
(casts, argmaxes, log-softmaxes, exp, scatter, the weighting, the cast back). Here each
program takes one row and reads the drafter's logits (and, for the soft KL, the
verifier's) once in their own dtype, keeping per lane the running maxima, sums of
exponentials, first argmax indices and, for the KL, Σ exp(t - max) · (t - z); a second
sweep writes the row's gradient over the drafter's logits in place (each element is read
before it is written, by the same program), so the chunk needs no tensor beside those it
was given. Without the KL the verifier's token comes as an id: no verifier logits at all.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _online(top, total, first, x, cols):
    """One sweep step of a lane's running max, Σ exp(x - max) and first argmax."""
    new_top = tl.maximum(top, x)
    first = tl.where(x > top, cols, first)  # strictly greater: a lane's first maximum
    # a lane that has seen only padding has -inf - -inf: keep it at 0
    total = tl.where(new_top > float("-inf"),
                     total * tl.exp(top - new_top) + tl.exp(x - new_top), 0.0)
    return new_top, total, first


@triton.jit
def _fold(top, total, first, V):
    """A row's max, logsumexp and first argmax from its lanes'."""
    row_top = tl.max(top, 0)
    lse = row_top + tl.log(tl.sum(total * tl.exp(top - row_top), 0))
    argmax = tl.min(tl.where(top == row_top, first, V), 0)
    return row_top, lse, argmax


@triton.jit
def _block_loss_kernel(z_ptr, t_ptr, weight_ptr, loss_ptr, mine_ptr, theirs_ptr,
                       V, z_stride, t_stride, soft_kl,
                       BLOCK: tl.constexpr, HAS_LOGITS: tl.constexpr, WANT_GRAD: tl.constexpr):
    # HAS_LOGITS: t_ptr holds the verifier's logits; else its token ids, one per row
    row = tl.program_id(0).to(tl.int64)
    z_row = z_ptr + row * z_stride
    t_row = t_ptr + row * t_stride
    lanes = tl.arange(0, BLOCK)
    z_top = tl.full([BLOCK], float("-inf"), tl.float32)
    t_top = tl.full([BLOCK], float("-inf"), tl.float32)
    z_total = tl.zeros([BLOCK], tl.float32)
    t_total = tl.zeros([BLOCK], tl.float32)
    z_first = tl.zeros([BLOCK], tl.int32)
    t_first = tl.zeros([BLOCK], tl.int32)
    gap = tl.zeros([BLOCK], tl.float32)  # Σ exp(t - t_top) · (t - z), for the KL
    for start in range(0, V, BLOCK):
        cols = start + lanes
        keep = cols < V
        z = tl.load(z_row + cols, mask=keep, other=float("-inf"),
                    eviction_policy="evict_last").to(tl.float32)
        if HAS_LOGITS:
            t = tl.load(t_row + cols, mask=keep, other=float("-inf"),
                        eviction_policy="evict_last").to(tl.float32)
            new_t_top = tl.maximum(t_top, t)
            gap = tl.where(keep & (new_t_top > float("-inf")),
                           gap * tl.exp(t_top - new_t_top) + tl.exp(t - new_t_top) * (t - z),
                           gap)
            t_top, t_total, t_first = _online(t_top, t_total, t_first, t, cols)
        z_top, z_total, z_first = _online(z_top, z_total, z_first, z, cols)
    z_max, z_lse, mine = _fold(z_top, z_total, z_first, V)
    if HAS_LOGITS:
        t_max, t_lse, theirs = _fold(t_top, t_total, t_first, V)
    else:
        theirs = tl.load(t_ptr + row).to(tl.int32)
    z_at = tl.load(z_row + theirs).to(tl.float32)
    loss = (1.0 - soft_kl) * (z_lse - z_at)
    if HAS_LOGITS:
        # KL(q || p) = Σ q (t - z) - lse(t) + lse(z), q = softmax(t)
        t_sum = tl.sum(t_total * tl.exp(t_top - t_max), 0)
        kl = tl.sum(gap * tl.exp(t_top - t_max), 0) / t_sum - t_lse + z_lse
        loss += soft_kl * kl
    tl.store(loss_ptr + row, loss)
    tl.store(mine_ptr + row, mine.to(tl.int64))
    if HAS_LOGITS:
        tl.store(theirs_ptr + row, theirs.to(tl.int64))
    if WANT_GRAD:
        # d loss / d z = softmax(z) - (1 - W) · onehot(theirs) - W · softmax(t), weighted
        weight = tl.load(weight_ptr + row).to(tl.float32)
        for start in range(0, V, BLOCK):
            cols = start + lanes
            keep = cols < V
            z = tl.load(z_row + cols, mask=keep, other=0.0,
                        eviction_policy="evict_first").to(tl.float32)
            grad = tl.exp(z - z_lse) - tl.where(cols == theirs, 1.0 - soft_kl, 0.0)
            if HAS_LOGITS:
                t = tl.load(t_row + cols, mask=keep, other=0.0,
                            eviction_policy="evict_first").to(tl.float32)
                grad -= soft_kl * tl.exp(t - t_lse)
            tl.store(z_row + cols, (grad * weight).to(z_ptr.dtype.element_ty), mask=keep)


def chunk_pass(z: Tensor, target: Tensor, weights: Tensor, soft_kl: float, want_grad: bool
               ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """z [C, V] the drafter's logits; target: the verifier's logits [C, V] (needed for the
    soft KL) or its token ids [C]; weights [C]. Returns the rows' unweighted losses
    (float32), both argmaxes and, if wanted, weights · d loss / dz written over z."""
    C, V = z.shape
    logits = target.is_floating_point()
    if soft_kl and not logits:
        raise ValueError("the soft KL needs the verifier's logits, not its token ids")
    if z.stride(1) != 1 or (logits and target.stride(1) != 1):
        raise ValueError("the DFlash chunk pass reads rows with a dense last dim")
    losses = torch.empty(C, dtype=torch.float32, device=z.device)
    mine = torch.empty(C, dtype=torch.long, device=z.device)
    theirs = torch.empty(C, dtype=torch.long, device=z.device) if logits else target
    if C:
        block = min(4096, triton.next_power_of_2(V))
        _block_loss_kernel[(C,)](
            z, target, weights, losses, mine, theirs, V, z.stride(0),
            target.stride(0) if logits else 0, float(soft_kl), BLOCK=block,
            HAS_LOGITS=logits, WANT_GRAD=want_grad,
            num_warps=max(1, min(16, block // 256)))
    return losses, mine, theirs, z if want_grad else None
