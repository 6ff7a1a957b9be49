"""The diagonal-key fold (attention.with_diagonal_keys) as Triton kernels, for CUDA.

Compiled by inductor, the fold ran at a small fraction of the GPU's copy bandwidth whether
its graph was one or four (docs/benchmarks.md, "The diagonal-key fold in Triton, flex's sm90 tiles"). Here each program takes one query
head and a block of rows and loops over the S diagonal keys with the row's tile in
registers: forward in two passes over the keys (the softmax's maximum and sum, then the
weights and the mixed values), backward in one kernel per query head (the gradients of q,
flex's output and log-sum-exp, and each key's score gradient) and one per key head and
key (the gradients of the keys and values, summed over the query heads that share it).

Same contracts as attention._fold_forward and _fold_backward: q, out, grad [B, Hq, L, D]
(any strides but a dense last dim), lse [B, Hq, L], keys and values stacked [S, B, Hkv, L,
D], the softmax weights p [S + 1, B, Hkv, G, L] in float32 (flex's output first). The
output and the gradients of q and out are laid out as q and out are (empty_like), as
flex_attention lays out its own: the trainer's token-major q then needs no copy to merge
its heads.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

BLOCK_L = 32  # rows per program: a [32, 128] fp32 tile is 32 registers a thread at 4 warps


@triton.jit
def _query_rows(B, Hq, G, L, D, BLOCK_L: tl.constexpr, BLOCK_D: tl.constexpr):
    """This program's block of rows of one query head (b, h): the row and column indices,
    their masks, the rows' offsets in the keys and values [S, B, Hkv, L, D] (and the
    distance between keys) and in p [S + 1, B, Hkv, G, L] (and the distance between its
    entries)."""
    l = tl.program_id(0).to(tl.int64) * BLOCK_L + tl.arange(0, BLOCK_L)
    bh = tl.program_id(1).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    rows = l < L
    tile = rows[:, None] & (d[None, :] < D)
    kv = (bh // G * L + l)[:, None] * D + d[None, :]  # (b * Hkv + h // G) = bh // G
    p_row = bh * L + l  # (b, h) is bh in p's (b, kv head, query head in group) too
    # The distances in int64: a loop's `s * kv_step` in int32 wrapped past 2^31 elements
    # (kimi-k2's 64 KV heads at 92,160 × TTT 5: 3 × 755M) and read keys before the stack.
    b64 = tl.cast(B, tl.int64)
    return (l, bh // Hq, bh % Hq, d, rows, tile, kv, b64 * (Hq // G) * L * D, p_row,
            b64 * Hq * L)


@triton.jit
def _tile(b, h, l, d, sb, sh, sl):
    """Offsets of rows l of head (b, h) in a [B, heads, L, D] tensor with a dense last dim."""
    return b * sb + h * sh + l[:, None] * sl + d[None, :]


@triton.jit
def _load_tile(ptr, b, h, l, d, sb, sh, sl, tile):
    """Rows l of head (b, h) of a [B, heads, L, D] tensor with a dense last dim, in fp32."""
    return tl.load(ptr + _tile(b, h, l, d, sb, sh, sl), mask=tile, other=0.0).to(tl.float32)


@triton.jit
def _fold_forward_kernel(q_ptr, out_ptr, lse_ptr, k_ptr, v_ptr, o_ptr, p_ptr,
                    q_sb, q_sh, q_sl, out_sb, out_sh, out_sl, lse_sb, lse_sh, lse_sl,
                    o_sb, o_sh, o_sl, S, B, Hq, G, L, D, scale,
                    BLOCK_L: tl.constexpr, BLOCK_D: tl.constexpr):
    l, b, h, d, rows, tile, kv, kv_step, p_row, p_step = _query_rows(
        B, Hq, G, L, D, BLOCK_L, BLOCK_D)
    q = _load_tile(q_ptr, b, h, l, d, q_sb, q_sh, q_sl, tile)
    lse = tl.load(lse_ptr + b * lse_sb + h * lse_sh + l * lse_sl, mask=rows,
                  other=0.0).to(tl.float32)
    # pass 1: the softmax's maximum and sum over [lse, scores], online
    m = lse
    total = tl.full([BLOCK_L], 1.0, tl.float32)
    for s in range(S):
        k = tl.load(k_ptr + s * kv_step + kv, mask=tile, other=0.0).to(tl.float32)
        score = tl.sum(q * k, axis=1) * scale
        m_new = tl.maximum(m, score)
        total = total * tl.exp(m - m_new) + tl.exp(score - m_new)
        m = m_new
    # pass 2: the weights, and flex's output and the values mixed by them
    p0 = tl.exp(lse - m) / total
    tl.store(p_ptr + p_row, p0, mask=rows)
    acc = _load_tile(out_ptr, b, h, l, d, out_sb, out_sh, out_sl, tile) * p0[:, None]
    for s in range(S):
        k = tl.load(k_ptr + s * kv_step + kv, mask=tile, other=0.0).to(tl.float32)
        weight = tl.exp(tl.sum(q * k, axis=1) * scale - m) / total
        tl.store(p_ptr + (s + 1) * p_step + p_row, weight, mask=rows)
        v = tl.load(v_ptr + s * kv_step + kv, mask=tile, other=0.0).to(tl.float32)
        acc += weight[:, None] * v
    tl.store(o_ptr + _tile(b, h, l, d, o_sb, o_sh, o_sl), acc.to(o_ptr.dtype.element_ty),
             mask=tile)


@triton.jit
def _fold_query_grads_kernel(g_ptr, out_ptr, p_ptr, k_ptr, v_ptr,
                        dq_ptr, dout_ptr, dlse_ptr, dscore_ptr,
                        g_sb, g_sh, g_sl, out_sb, out_sh, out_sl, dq_sb, dq_sh, dq_sl,
                        dout_sb, dout_sh, dout_sl, S, B, Hq, G, L, D, scale,
                        BLOCK_L: tl.constexpr, BLOCK_D: tl.constexpr):
    l, b, h, d, rows, tile, kv, kv_step, p_row, p_step = _query_rows(
        B, Hq, G, L, D, BLOCK_L, BLOCK_D)
    g = _load_tile(g_ptr, b, h, l, d, g_sb, g_sh, g_sl, tile)
    flex_out = _load_tile(out_ptr, b, h, l, d, out_sb, out_sh, out_sl, tile)
    # the softmax over [lse, scores]: d logit_j = p_j (g.v_j - g.o), v_0 being flex's out
    p0 = tl.load(p_ptr + p_row, mask=rows, other=0.0)
    along_out = tl.sum(g * flex_out, axis=1)
    mean = p0 * along_out
    for s in range(S):
        v = tl.load(v_ptr + s * kv_step + kv, mask=tile, other=0.0).to(tl.float32)
        weight = tl.load(p_ptr + (s + 1) * p_step + p_row, mask=rows, other=0.0)
        mean += weight * tl.sum(g * v, axis=1)
    tl.store(dlse_ptr + p_row, p0 * (along_out - mean), mask=rows)
    tl.store(dout_ptr + _tile(b, h, l, d, dout_sb, dout_sh, dout_sl),
             (g * p0[:, None]).to(dout_ptr.dtype.element_ty), mask=tile)
    dq = tl.zeros([BLOCK_L, BLOCK_D], tl.float32)
    for s in range(S):
        v = tl.load(v_ptr + s * kv_step + kv, mask=tile, other=0.0).to(tl.float32)
        weight = tl.load(p_ptr + (s + 1) * p_step + p_row, mask=rows, other=0.0)
        dscore = weight * (tl.sum(g * v, axis=1) - mean) * scale
        tl.store(dscore_ptr + s * p_step + p_row, dscore, mask=rows)
        k = tl.load(k_ptr + s * kv_step + kv, mask=tile, other=0.0).to(tl.float32)
        dq += dscore[:, None] * k
    tl.store(dq_ptr + _tile(b, h, l, d, dq_sb, dq_sh, dq_sl), dq.to(dq_ptr.dtype.element_ty),
             mask=tile)


@triton.jit
def _fold_key_grads_kernel(q_ptr, g_ptr, p_ptr, dscore_ptr, dk_ptr, dv_ptr,
                      q_sb, q_sh, q_sl, g_sb, g_sh, g_sl,
                      B, Hq, G, L, D,
                      BLOCK_L: tl.constexpr, BLOCK_D: tl.constexpr):
    l = tl.program_id(0).to(tl.int64) * BLOCK_L + tl.arange(0, BLOCK_L)
    b_hkv = tl.program_id(1).to(tl.int64)
    s = tl.program_id(2).to(tl.int64)
    Hkv = Hq // G
    b, hkv = b_hkv // Hkv, b_hkv % Hkv
    d = tl.arange(0, BLOCK_D)
    rows = l < L
    tile = rows[:, None] & (d[None, :] < D)
    p_step = B * Hq * L
    dk = tl.zeros([BLOCK_L, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_L, BLOCK_D], tl.float32)
    for j in range(G):
        h = hkv * G + j
        p_row = (b * Hq + h) * L + l
        dscore = tl.load(dscore_ptr + s * p_step + p_row, mask=rows, other=0.0)
        weight = tl.load(p_ptr + (s + 1) * p_step + p_row, mask=rows, other=0.0)
        q = _load_tile(q_ptr, b, h, l, d, q_sb, q_sh, q_sl, tile)
        g = _load_tile(g_ptr, b, h, l, d, g_sb, g_sh, g_sl, tile)
        dk += dscore[:, None] * q
        dv += weight[:, None] * g
    kv = ((s * B * Hkv + b_hkv) * L + l)[:, None] * D + d[None, :]
    tl.store(dk_ptr + kv, dk.to(dk_ptr.dtype.element_ty), mask=tile)
    tl.store(dv_ptr + kv, dv.to(dv_ptr.dtype.element_ty), mask=tile)


def _dense_last(t: Tensor) -> Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def fold_forward(q: Tensor, out: Tensor, lse: Tensor, keys: Tensor,
                 values: Tensor) -> tuple[Tensor, Tensor]:
    S, B, Hkv, L, D = keys.shape
    Hq = q.shape[1]
    q, out = _dense_last(q), _dense_last(out)
    keys, values = keys.contiguous(), values.contiguous()
    o = torch.empty_like(q)
    p = torch.empty(S + 1, B, Hkv, Hq // Hkv, L, dtype=torch.float32, device=q.device)
    _fold_forward_kernel[(triton.cdiv(L, BLOCK_L), B * Hq)](
        q, out, lse, keys, values, o, p, *q.stride()[:3], *out.stride()[:3], *lse.stride(),
        *o.stride()[:3], S, B, Hq, Hq // Hkv, L, D, 1 / math.sqrt(D),
        BLOCK_L=BLOCK_L, BLOCK_D=triton.next_power_of_2(D))
    return o, p


def fold_backward(grad: Tensor, q: Tensor, out: Tensor, p: Tensor, keys: Tensor,
                  values: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    S, B, Hkv, L, D = keys.shape
    Hq = q.shape[1]
    grad, q, out = _dense_last(grad), _dense_last(q), _dense_last(out)
    keys, values, p = keys.contiguous(), values.contiguous(), p.contiguous()
    d_q, d_out = torch.empty_like(q), torch.empty_like(out)
    d_lse = torch.empty(B, Hq, L, dtype=p.dtype, device=q.device)
    d_score = torch.empty(S, B, Hq, L, dtype=p.dtype, device=q.device)
    blocks, block_d = triton.cdiv(L, BLOCK_L), triton.next_power_of_2(D)
    _fold_query_grads_kernel[(blocks, B * Hq)](
        grad, out, p, keys, values, d_q, d_out, d_lse, d_score,
        *grad.stride()[:3], *out.stride()[:3], *d_q.stride()[:3], *d_out.stride()[:3],
        S, B, Hq, Hq // Hkv, L, D, 1 / math.sqrt(D),
        BLOCK_L=BLOCK_L, BLOCK_D=block_d)
    d_keys, d_values = torch.empty_like(keys), torch.empty_like(values)
    _fold_key_grads_kernel[(blocks, B * Hkv, S)](
        q, grad, p, d_score, d_keys, d_values, *q.stride()[:3], *grad.stride()[:3],
        B, Hq, Hq // Hkv, L, D, BLOCK_L=BLOCK_L, BLOCK_D=block_d)
    return d_q, d_out, d_lse, d_keys, d_values
