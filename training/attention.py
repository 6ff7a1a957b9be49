"""Attention for packed rows under EAGLE-3's training-time test (TTT).

At TTT step k a query at index i sees the step-0 keys j <= i of its own sample, and the
keys that steps 1..k made at index i (the tokens this chain drafted before). The step-0
part is ordinary document-causal attention; the diagonal part is k extra scores per query.
They are merged through log-sum-exp, so the step-0 keys and values are computed once and
the key length never grows with k.

Document-causal attention has two exact implementations: a dense masked one for CPU and
short rows, and flex_attention with a BlockMask built from the sample boundaries for CUDA
(never an L x L grid).
"""
from __future__ import annotations

import functools
import math

import torch
from torch import Tensor
from torch.nn.attention.flex_attention import AuxRequest, BlockMask, flex_attention


BLOCK = 128  # flex_attention's sparse block size


def doc_starts(doc_ids: Tensor) -> Tensor:
    """[B, L] index of the first token of each token's sample (padding counts as one)."""
    idx = torch.arange(doc_ids.shape[1], device=doc_ids.device).expand_as(doc_ids)
    is_start = torch.ones_like(doc_ids, dtype=torch.bool)
    is_start[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    return torch.where(is_start, idx, 0).cummax(dim=1).values


def at_least_float32(dtype: torch.dtype) -> torch.dtype:
    """Softmaxes and norms run in float32 for bf16 activations, float64 for float64 ones."""
    return torch.promote_types(dtype, torch.float32)


def _grouped(q: Tensor, num_kv_heads: int) -> Tensor:
    # [B, Hq, L, D] -> [B, Hkv, G, L, D]: query heads that share one key/value head.
    B, Hq, L, D = q.shape
    return q.view(B, num_kv_heads, Hq // num_kv_heads, L, D)


def dense_doc_causal(q: Tensor, k: Tensor, v: Tensor, doc_ids: Tensor) -> tuple[Tensor, Tensor]:
    """Exact reference: q [B,Hq,L,D], k/v [B,Hkv,L,D] -> (out [B,Hq,L,D], lse [B,Hq,L])."""
    B, Hq, L, D = q.shape
    qg = _grouped(q, k.shape[1])
    acc = at_least_float32(q.dtype)
    scores = (qg @ k.unsqueeze(2).transpose(-1, -2)).to(acc) * (1.0 / math.sqrt(D))
    pos = torch.arange(L, device=q.device)
    allowed = (doc_ids[:, :, None] == doc_ids[:, None, :]) & (pos[None, :] <= pos[:, None])
    scores = scores.masked_fill(~allowed[:, None, None], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse[..., None]).to(v.dtype)
    out = probs @ v.unsqueeze(2)
    return out.reshape(B, Hq, L, D), lse.reshape(B, Hq, L)


def doc_causal_block_mask(doc_ids: Tensor) -> BlockMask:
    """The BlockMask of document-causal attention, from the sample boundaries alone.

    Samples are contiguous, so query block qb needs the kv blocks from the one holding the
    start of its first query's sample up to qb itself. Of these, the blocks from the one
    starting at or after the start of its last query's sample up to qb - 1 lie wholly
    inside that sample and before the queries: full blocks, which skip mask_mod.
    """
    B, L = doc_ids.shape
    if L % BLOCK:
        raise ValueError(f"row length {L} is not a multiple of {BLOCK}")
    nb = L // BLOCK
    starts = doc_starts(doc_ids)
    qb = torch.arange(nb, device=doc_ids.device)
    lo = starts[:, ::BLOCK] // BLOCK  # [B, nb]
    full_lo = (starts[:, BLOCK - 1::BLOCK] + BLOCK - 1) // BLOCK
    n_partial_before = torch.minimum(full_lo, qb) - lo
    ar = torch.arange(nb, device=doc_ids.device)
    kv_indices = (lo[..., None] + ar).clamp_(max=nb - 1)
    kv_indices.scatter_(-1, n_partial_before[..., None], qb.expand(B, nb)[..., None])
    full_indices = (full_lo[..., None] + ar).clamp_(max=nb - 1)
    full_num = (qb - full_lo).clamp_(min=0)

    docs = doc_ids.clone()
    docs[docs < 0] = torch.iinfo(docs.dtype).max  # padding is one more sample, at the end

    def mask_mod(b, h, q_idx, kv_idx):
        return (docs[b, q_idx] == docs[b, kv_idx]) & (kv_idx <= q_idx)

    i32 = torch.int32
    return BlockMask.from_kv_blocks(
        (n_partial_before + 1).to(i32)[:, None], kv_indices.to(i32)[:, None],
        full_num.to(i32)[:, None], full_indices.to(i32)[:, None],
        BLOCK_SIZE=BLOCK, mask_mod=mask_mod, seq_lengths=(L, L))


@functools.cache
def _compiled_flex():
    # Dynamic shapes: one kernel for every row length, found in inductor's on-disk cache
    # by a relaunch with a new max_seq_len (H200: 6.4 s from the start event to the first
    # step at a new length, against 14.7 s for a cold compile; docs/benchmarks.md).
    return torch.compile(flex_attention, dynamic=True)


def flex_doc_causal(q: Tensor, k: Tensor, v: Tensor,
                    block_mask: BlockMask) -> tuple[Tensor, Tensor]:
    out, aux = _compiled_flex()(q, k, v, block_mask=block_mask, enable_gqa=True,
                                return_aux=AuxRequest(lse=True))
    return out, aux.lse


class DocLayout:
    """One packed batch's sample boundaries, prepared once for all layers and TTT steps."""

    def __init__(self, doc_ids: Tensor, use_flex: bool | None = None):
        self.doc_ids = doc_ids
        self.use_flex = doc_ids.is_cuda if use_flex is None else use_flex
        self.block_mask = None
        if self.use_flex:
            # flex_attention works on whole blocks: pad the row with one more padding run.
            self.pad = -doc_ids.shape[1] % BLOCK
            padded = torch.nn.functional.pad(doc_ids, (0, self.pad), value=-1)
            self.block_mask = doc_causal_block_mask(padded)

    def doc_causal(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        if not self.use_flex:
            return dense_doc_causal(q, k, v, self.doc_ids)
        if not self.pad:
            return flex_doc_causal(q, k, v, self.block_mask)
        L = q.shape[2]
        q, k, v = (torch.nn.functional.pad(t, (0, 0, 0, self.pad)) for t in (q, k, v))
        out, lse = flex_doc_causal(q, k, v, self.block_mask)
        return out[:, :, :L], lse[:, :, :L]


def ttt_attention(q: Tensor, k0: Tensor, v0: Tensor, diag_k: list[Tensor],
                  diag_v: list[Tensor], layout: DocLayout) -> Tensor:
    """Step-k attention: document-causal over step-0 keys plus the diagonal keys of 1..k.

    q [B,Hq,L,D]; k0/v0 and each diag_k/diag_v entry [B,Hkv,L,D]. Returns [B,Hq,L,D].
    """
    out0, lse0 = layout.doc_causal(q, k0, v0)
    if not diag_k:
        return out0
    # One diagonal key at a time, never stacked: a stack of kimi-k2's keys at 64K tokens
    # passes 2^31 elements, and a compiled merge then changed graphs between the forward
    # and a checkpointed step's recomputation. Eager ops save the same tensors every time.
    B, Hq, L, D = q.shape
    Hkv = k0.shape[1]
    qg = _grouped(q, Hkv)
    acc = at_least_float32(q.dtype)
    scores = [torch.einsum("bhgld,bhld->bhgl", qg, k).to(acc) * (1.0 / math.sqrt(D))
              for k in diag_k]
    lse0 = lse0.view(B, Hkv, Hq // Hkv, L).to(acc)
    lse = torch.logsumexp(torch.stack([lse0, *scores]), dim=0)
    out = _grouped(out0, Hkv).to(acc) * torch.exp(lse0 - lse)[..., None]
    for score, v in zip(scores, diag_v):
        out = out + torch.exp(score - lse)[..., None].to(v.dtype) * v[:, :, None]
    return out.to(q.dtype).reshape(B, Hq, L, D)
