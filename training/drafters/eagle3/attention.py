"""Attention for packed rows under EAGLE-3's training-time test (TTT).

At TTT step k a query at index i sees the step-0 keys j <= i of its own sample, and the
keys that steps 1..k made at index i (the tokens this chain drafted before): one softmax
over the step-0 keys, document-causal, and k diagonal ones.

Two exact implementations: for CUDA, flex_attention over the step-0 keys alone, with a
BlockMask built from the sample boundaries (never an L x L grid), and the k diagonal keys
folded into its output through its log-sum-exp (with_diagonal_keys: one dot product per
query and key, where a block of the mask would compute 128); for CPU and short rows, a
dense masked softmax over the k + 1 segments of keys laid end to end.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.nn.attention.flex_attention import AuxRequest, BlockMask

from training.config import FLEX_BLOCK as BLOCK
from training.flex import (at_least_float32, compiled_flex, dense_attention, doc_starts,
                           flex_kernel_options, with_dynamic_block_counts)


def ttt_mask_mod(doc_ids: Tensor, segments: int):
    """mask_mod(b, h, q_idx, kv_idx) over `segments` key segments of the row [B, L]:
    document-causal in the first, the diagonal (kv position == q_idx) in the others.
    Indices may be tensors of any broadcastable shapes (the dense path's grids)."""
    B, L = doc_ids.shape
    docs = doc_ids.clone()
    docs[docs < 0] = torch.iinfo(docs.dtype).max  # padding is one more sample, at the end
    kv_docs = docs.repeat(1, segments)
    kv_pos = torch.arange(L, device=doc_ids.device).repeat(segments)
    later = torch.arange(segments * L, device=doc_ids.device) >= L

    def mask_mod(b, h, q_idx, kv_idx):
        pos = kv_pos[kv_idx]
        return ((docs[b, q_idx] == kv_docs[b, kv_idx]) & (pos <= q_idx)
                & (~later[kv_idx] | (pos >= q_idx)))
    return mask_mod


def doc_causal_mask_mod(doc_ids: Tensor):
    """ttt_mask_mod of one segment, from each query's sample start: one lookup per query
    where the general rule looks up both sides."""
    starts = doc_starts(doc_ids)

    def mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (kv_idx >= starts[b, q_idx])
    return mask_mod


def doc_causal_block_mask(doc_ids: Tensor) -> BlockMask:
    """The BlockMask of doc_causal_mask_mod, from the sample boundaries alone.

    Samples are contiguous, so query block qb needs the kv blocks from the one holding
    the start of its first query's sample up to qb itself. Of these, the blocks from the
    one starting at or after the start of its last query's sample up to qb - 1 lie wholly
    inside that sample and before the queries: full blocks, which skip mask_mod.
    """
    B, L = doc_ids.shape
    if L % BLOCK:
        raise ValueError(f"row length {L} is not a multiple of {BLOCK}")
    nb = L // BLOCK
    dev = doc_ids.device
    starts = doc_starts(doc_ids)
    qb = torch.arange(nb, device=dev)
    lo = starts[:, ::BLOCK] // BLOCK  # [B, nb]
    full_lo = (starts[:, BLOCK - 1::BLOCK] + BLOCK - 1) // BLOCK
    n_partial_before = torch.minimum(full_lo, qb) - lo
    ar = torch.arange(nb, device=dev)
    kv_indices = (lo[..., None] + ar).clamp_(max=nb - 1)
    kv_indices.scatter_(-1, n_partial_before[..., None], qb[:, None].expand(B, nb, 1))
    full_indices = (full_lo[..., None] + ar).clamp_(max=nb - 1)
    full_num = (qb - full_lo).clamp_(min=0)
    i32 = torch.int32
    mask = BlockMask.from_kv_blocks(
        (n_partial_before + 1)[:, None].to(i32), kv_indices[:, None].to(i32),
        full_num[:, None].to(i32), full_indices[:, None].to(i32),
        BLOCK_SIZE=BLOCK, mask_mod=doc_causal_mask_mod(doc_ids), seq_lengths=(L, L))
    return with_dynamic_block_counts(mask)


def _fold_forward(q: Tensor, out: Tensor, lse: Tensor, keys: Tensor,
                  values: Tensor) -> tuple[Tensor, Tensor]:
    """with_diagonal_keys on stacked keys and values [S, B, Hkv, L, D]; also returns the
    softmax weights [S + 1, B, Hkv, G, L] (flex's output first), what backward needs."""
    S, B, Hkv, L, D = keys.shape
    G = q.shape[1] // Hkv  # query heads that share one key/value head
    f = at_least_float32(q.dtype)
    scores = (q.reshape(B, Hkv, G, L, D).to(f) * keys[:, :, :, None].to(f)).sum(-1)
    logits = torch.cat([lse.view(1, B, Hkv, G, L).to(f), scores / math.sqrt(D)])
    p = logits.softmax(0)
    o = out.reshape(B, Hkv, G, L, D).to(f) * p[0, ..., None] \
        + (p[1:, ..., None] * values[:, :, :, None].to(f)).sum(0)
    return o.view(B, Hkv * G, L, D).to(q.dtype), p


def _fold_backward(grad: Tensor, q: Tensor, out: Tensor, p: Tensor, keys: Tensor,
                   values: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Gradients of _fold_forward's output for q, out, lse, keys and values."""
    S, B, Hkv, L, D = keys.shape
    G = q.shape[1] // Hkv
    f = p.dtype
    g = grad.reshape(B, Hkv, G, L, D).to(f)
    # the softmax over [lse, scores]: d logit_j = p_j (g·v_j - g·o), v_0 being flex's out
    a_out = (g * out.reshape(B, Hkv, G, L, D).to(f)).sum(-1)
    a_keys = (g[None] * values[:, :, :, None].to(f)).sum(-1)
    a_mean = p[0] * a_out + (p[1:] * a_keys).sum(0)
    d_lse = p[0] * (a_out - a_mean)
    d_scores = p[1:] * (a_keys - a_mean) / math.sqrt(D)
    d_q = (d_scores[..., None] * keys[:, :, :, None].to(f)).sum(0)
    d_keys = (d_scores[..., None] * q.reshape(B, Hkv, G, L, D).to(f)).sum(3)
    d_values = (p[1:, ..., None] * g).sum(3)
    d_out = g * p[0, ..., None]
    return (d_q.view(B, Hkv * G, L, D).to(q.dtype), d_out.view(B, Hkv * G, L, D).to(out.dtype),
            d_lse.view(B, Hkv * G, L), d_keys.to(keys.dtype), d_values.to(values.dtype))


def _fold_passes(q: Tensor):
    """The fold's forward and backward for q's device: Triton kernels on CUDA
    (training/drafters/eagle3/fold_triton.py: inductor's compile of the functions above ran far below the
    copy bandwidth; docs/benchmarks.md, "The diagonal-key fold in Triton, flex's sm90 tiles"), those functions elsewhere."""
    if q.is_cuda:
        from training.drafters.eagle3 import fold_triton  # imports Triton, which CUDA machines have
        return fold_triton.fold_forward, fold_triton.fold_backward
    return _fold_forward, _fold_backward


class _DiagonalFold(torch.autograd.Function):
    """with_diagonal_keys' autograd: the keys and values are stacked for each pass and the
    stack freed after it, so one kernel serves any number of them, and backward keeps only
    the softmax weights besides tensors the step keeps anyway."""

    @staticmethod
    def forward(ctx, q: Tensor, out: Tensor, lse: Tensor, *keys_values: Tensor) -> Tensor:
        S = len(keys_values) // 2
        o, p = _fold_passes(q)[0](q, out, lse, torch.stack(keys_values[:S]),
                                  torch.stack(keys_values[S:]))
        ctx.save_for_backward(q, out, p, *keys_values)
        ctx.lse_dtype = lse.dtype
        return o

    @staticmethod
    def backward(ctx, grad: Tensor):
        q, out, p, *keys_values = ctx.saved_tensors
        S = len(keys_values) // 2
        d_q, d_out, d_lse, d_keys, d_values = _fold_passes(q)[1](
            grad, q, out, p, torch.stack(keys_values[:S]), torch.stack(keys_values[S:]))
        return d_q, d_out, d_lse.to(ctx.lse_dtype), *d_keys.unbind(0), *d_values.unbind(0)


def with_diagonal_keys(q: Tensor, out: Tensor, lse: Tensor, keys: list[Tensor],
                       values: list[Tensor]) -> Tensor:
    """The attention of q over some keys, given as its output `out` and log-sum-exp `lse`
    [B, Hq, L], extended by one more key and value per query and list entry, at the
    query's own index: each [B, Hkv, L, D]."""
    return _DiagonalFold.apply(q, out, lse, *keys, *values)


class DocLayout:
    """One packed batch's sample boundaries, prepared once for all layers and TTT steps."""

    def __init__(self, doc_ids: Tensor, use_flex: bool | None = None):
        self.doc_ids = doc_ids
        self.use_flex = doc_ids.is_cuda if use_flex is None else use_flex
        # flex_attention works on whole blocks: the row is padded with one more padding run.
        self.pad = -doc_ids.shape[1] % BLOCK if self.use_flex else 0
        self._masks: dict[int, BlockMask | Tensor] = {}

    def mask(self, segments: int) -> BlockMask | Tensor:
        """The dense path's [B, L, segments * L] mask, or flex's BlockMask over the step-0
        keys (segments is 1 there); made once per batch (a checkpointed step's
        recomputation finds it here)."""
        if segments not in self._masks:
            if self.use_flex:
                padded = torch.nn.functional.pad(self.doc_ids, (0, self.pad), value=-1)
                self._masks[segments] = doc_causal_block_mask(padded)
            else:
                B, L = self.doc_ids.shape
                rule = ttt_mask_mod(self.doc_ids, segments)
                b = torch.arange(B, device=self.doc_ids.device)[:, None, None]
                idx = torch.arange(segments * L, device=self.doc_ids.device)
                self._masks[segments] = rule(b, None, idx[None, :L, None], idx[None, None])
        return self._masks[segments]


def ttt_attention(q: Tensor, keys: list[Tensor], values: list[Tensor],
                  layout: DocLayout) -> Tensor:
    """Step-k attention: q [B,Hq,L,D]; keys and values: step 0's, then those of steps
    1..k (the diagonal ones), each [B,Hkv,L,D]. Returns [B,Hq,L,D]."""
    if not layout.use_flex:
        k = keys[0] if len(keys) == 1 else torch.cat(keys, dim=2)
        v = values[0] if len(values) == 1 else torch.cat(values, dim=2)
        return dense_attention(q, k, v, layout.mask(len(keys)))
    L = q.shape[2]
    q0, k0, v0 = q, keys[0], values[0]
    if layout.pad:
        q0, k0, v0 = (torch.nn.functional.pad(t, (0, 0, 0, layout.pad)) for t in (q, k0, v0))
    out, aux = compiled_flex()(q0, k0, v0, block_mask=layout.mask(1), enable_gqa=True,
                                return_aux=AuxRequest(lse=True),
                                kernel_options=flex_kernel_options(q))
    out, lse = out[:, :, :L], aux.lse[:, :, :L]
    if len(keys) == 1:
        return out
    return with_diagonal_keys(q, out, lse, keys[1:], values[1:])
