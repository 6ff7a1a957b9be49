"""Attention for packed rows under EAGLE-3's training-time test (TTT).

At TTT step k a query at index i sees the step-0 keys j <= i of its own sample, and the
keys that steps 1..k made at index i (the tokens this chain drafted before). The keys of
steps 0..k are laid end to end, k + 1 segments of the row's length, and attended in one
call under one mask: document-causal over segment 0, the diagonal in each later one.

Two exact implementations share that mask: flex_attention with a BlockMask built from the
sample boundaries for CUDA (never an L x L grid; each later segment adds one block per
query block), and a dense masked one for CPU and short rows.
"""
from __future__ import annotations

import functools
import math

import torch
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask, flex_attention


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


# The BlockMask's index tensors, whose block-count dimensions ttt_block_mask marks dynamic.
_BLOCK_TENSORS = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
                  "q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices")


def ttt_block_mask(doc_ids: Tensor, segments: int = 1) -> BlockMask:
    """The BlockMask of ttt_mask_mod, from the sample boundaries alone.

    Samples are contiguous, so query block qb needs the segment-0 kv blocks from the one
    holding the start of its first query's sample up to qb itself. Of these, the blocks
    from the one starting at or after the start of its last query's sample up to qb - 1
    lie wholly inside that sample and before the queries: full blocks, which skip
    mask_mod. Each later segment s adds its block s * nb + qb, the diagonal's.
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
    ar = torch.arange(segments * nb, device=dev)
    kv_indices = (lo[..., None] + ar).clamp_(max=nb - 1)
    seg = torch.arange(segments, device=dev)
    kv_indices.scatter_(-1, n_partial_before[..., None] + seg,
                        (qb[:, None] + seg * nb).expand(B, nb, segments))
    full_indices = (full_lo[..., None] + ar).clamp_(max=nb - 1)
    full_num = (qb - full_lo).clamp_(min=0)
    i32 = torch.int32
    mask = BlockMask.from_kv_blocks(
        (n_partial_before + segments)[:, None].to(i32), kv_indices[:, None].to(i32),
        full_num[:, None].to(i32), full_indices[:, None].to(i32),
        BLOCK_SIZE=BLOCK, mask_mod=ttt_mask_mod(doc_ids, segments),
        seq_lengths=(L, segments * L))
    # Left static, the block counts would key the compiled flex graphs to this row
    # length: a launch at a new max_seq_len would compile flex again instead of finding
    # it in inductor's disk cache. A view is guarded on its base's strides too, so each
    # tensor marked must own its storage.
    for name in _BLOCK_TENSORS:
        t = getattr(mask, name)
        t = t.clone() if t._base is not None else t
        for dim in range(2, t.dim()):
            torch._dynamo.maybe_mark_dynamic(t, dim)
        setattr(mask, name, t)
    return mask


def dense_attention(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor) -> Tensor:
    """Exact reference: q [B,Hq,L,D], k/v [B,Hkv,S,D], allowed [B,L,S] -> [B,Hq,L,D]."""
    B, Hq, L, D = q.shape
    Hkv = k.shape[1]
    qg = q.view(B, Hkv, Hq // Hkv, L, D)  # query heads that share one key/value head
    acc = at_least_float32(q.dtype)
    scores = (qg @ k.unsqueeze(2).transpose(-1, -2)).to(acc) * (1.0 / math.sqrt(D))
    scores = scores.masked_fill(~allowed[:, None, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(v.dtype)
    return (probs @ v.unsqueeze(2)).reshape(B, Hq, L, D)


@functools.cache
def _compiled_flex():
    # Dynamic shapes: one kernel for every row length, found in inductor's on-disk cache
    # by a relaunch with a new max_seq_len (H200: 6.4 s from the start event to the first
    # step at a new length, against 14.7 s for a cold compile; docs/benchmarks.md).
    return torch.compile(flex_attention, dynamic=True)


class DocLayout:
    """One packed batch's sample boundaries, prepared once for all layers and TTT steps."""

    def __init__(self, doc_ids: Tensor, use_flex: bool | None = None):
        self.doc_ids = doc_ids
        self.use_flex = doc_ids.is_cuda if use_flex is None else use_flex
        # flex_attention works on whole blocks: each segment is padded with one more
        # padding run.
        self.pad = -doc_ids.shape[1] % BLOCK if self.use_flex else 0
        self._masks: dict[int, BlockMask | Tensor] = {}

    def mask(self, segments: int) -> BlockMask | Tensor:
        """The step's mask over `segments` key segments, made once per batch (a
        checkpointed step's recomputation finds it here)."""
        if segments not in self._masks:
            if self.use_flex:
                padded = torch.nn.functional.pad(self.doc_ids, (0, self.pad), value=-1)
                self._masks[segments] = ttt_block_mask(padded, segments)
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
    L = q.shape[2]
    if layout.pad:
        B, Hkv, _, D = keys[0].shape
        q = torch.nn.functional.pad(q, (0, 0, 0, layout.pad))
        gap = keys[0].new_zeros(B, Hkv, layout.pad, D)
        keys = [t for k in keys for t in (k, gap)]
        values = [t for v in values for t in (v, gap)]
    k = keys[0] if len(keys) == 1 else torch.cat(keys, dim=2)
    v = values[0] if len(values) == 1 else torch.cat(values, dim=2)
    segments = k.shape[2] // q.shape[2]
    if layout.use_flex:
        out = _compiled_flex()(q, k, v, block_mask=layout.mask(segments), enable_gqa=True)
    else:
        out = dense_attention(q, k, v, layout.mask(segments))
    return out[:, :, :L] if layout.pad else out
