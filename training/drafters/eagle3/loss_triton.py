"""The loss's per-chunk pass (loss._chunk_losses) as one Triton kernel, for CUDA.

Inductor compiled the pass as a looped reduction well below the GPU's copy bandwidth
(docs/benchmarks.md, "The loss's chunk pass in Triton, three copies gone"). Each program takes one row: a first sweep over the
vocabulary keeps, per lane, a running maximum, sum of exponentials, first index of the
maximum and sum of q * z, and folds the lanes once at the end; the second sweep writes
the gradient, reading the row again while it is still in L2.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _chunk_losses_kernel(z_ptr, q_ptr, rows_ptr, loss_ptr, argmax_ptr, grad_ptr,
                         V, z_stride, q_stride, grad_stride,
                         BLOCK: tl.constexpr, WANT_GRAD: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    z_row = z_ptr + row * z_stride
    q_row = q_ptr + tl.load(rows_ptr + row).to(tl.int64) * q_stride
    lanes = tl.arange(0, BLOCK)
    top = tl.full([BLOCK], float("-inf"), tl.float32)
    total = tl.zeros([BLOCK], tl.float32)  # sum of exp(z - top)
    qz = tl.zeros([BLOCK], tl.float32)
    first = tl.zeros([BLOCK], tl.int32)
    for start in range(0, V, BLOCK):
        cols = start + lanes
        keep = cols < V
        z = tl.load(z_row + cols, mask=keep, other=float("-inf"),
                    eviction_policy="evict_last").to(tl.float32)
        q = tl.load(q_row + cols, mask=keep, other=0.0,
                    eviction_policy="evict_last").to(tl.float32)
        new_top = tl.maximum(top, z)
        first = tl.where(z > top, cols, first)  # strictly greater: a lane's first maximum
        # a lane that has seen only the padding (V < BLOCK) has -inf - -inf: keep it at 0
        total = tl.where(new_top > float("-inf"),
                         total * tl.exp(top - new_top) + tl.exp(z - new_top), 0.0)
        top = new_top
        qz += tl.where(keep, q * z, 0.0)
    row_top = tl.max(top, 0)
    lse = row_top + tl.log(tl.sum(total * tl.exp(top - row_top), 0))
    # -sum(q * log_softmax(z)) = logsumexp(z) - sum(q * z), as q sums to 1
    tl.store(loss_ptr + row, lse - tl.sum(qz, 0))
    tl.store(argmax_ptr + row, tl.min(tl.where(top == row_top, first, V), 0).to(tl.int64))
    if WANT_GRAD:
        grad_row = grad_ptr + row * grad_stride
        for start in range(0, V, BLOCK):
            cols = start + lanes
            keep = cols < V
            z = tl.load(z_row + cols, mask=keep, other=0.0,
                        eviction_policy="evict_first").to(tl.float32)
            q = tl.load(q_row + cols, mask=keep, other=0.0,
                        eviction_policy="evict_first").to(tl.float32)
            tl.store(grad_row + cols, (tl.exp(z - lse) - q).to(grad_ptr.dtype.element_ty),
                     mask=keep)


def chunk_losses(logits: Tensor, probs: Tensor, rows: Tensor,
                 want_grad: bool) -> tuple[Tensor, Tensor, Tensor | None]:
    """loss._chunk_losses on CUDA: logits [C, V] and probs [N, V] with dense rows, rows
    [C] indexing probs. Losses in float32."""
    C, V = logits.shape
    if logits.stride(1) != 1 or probs.stride(1) != 1:
        raise ValueError("chunk_losses reads rows with a dense last dim")
    losses = torch.empty(C, dtype=torch.float32, device=logits.device)
    argmax = torch.empty(C, dtype=torch.long, device=logits.device)
    grad = torch.empty_like(logits, memory_format=torch.contiguous_format) if want_grad else None
    if C:
        # 4096 lanes and 16 warps: the fastest of seven shapes at [2048 x 32000] bf16
        block = min(4096, triton.next_power_of_2(V))
        _chunk_losses_kernel[(C,)](
            logits, probs, rows, losses, argmax, logits if grad is None else grad, V,
            logits.stride(0), probs.stride(0), 0 if grad is None else grad.stride(0),
            BLOCK=block, WANT_GRAD=want_grad, num_warps=max(1, min(16, block // 256)))
    return losses, argmax, grad
