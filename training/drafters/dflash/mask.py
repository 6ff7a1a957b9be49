"""Who sees whom in a DFlash pass over a packed row.

Queries are the blocks' tokens, slot-major: query q is offset q % block_size of the block
in anchor slot q // block_size. Keys are the row's L context positions (the verifier's
hidden states) followed by the same block tokens. A query sees the context of its own
sample strictly before its anchor (what the verifier has computed when the block is
drafted: the anchor is the token it has just emitted) and every token of its own block,
in both directions; never another block, another sample or padding.

Samples are contiguous in a packed row, so the context a slot sees is one range
[start of its anchor's sample, anchor): the rule needs one lookup per query, none per key.

Two implementations of one rule: a dense [B, Q, L + Q] mask for the CPU and short rows,
and flex_attention's BlockMask for CUDA, whose blocks come from the same ranges (never a
Q × (L + Q) grid) and whose partial blocks run the same mask_mod.
"""
from __future__ import annotations

import torch
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from training.flex import (compiled_flex, dense_attention, doc_starts, flex_kernel_options,
                           with_dynamic_block_counts)
from training.config import FLEX_BLOCK as BLOCK


def context_ranges(doc_ids: Tensor, anchors: Tensor) -> tuple[Tensor, Tensor]:
    """[B, A] each slot's context range [lo, hi): its anchor's sample start and the
    anchor. An unused slot (anchored at 0) has the empty range [0, 0)."""
    return doc_starts(doc_ids).gather(1, anchors), anchors


def block_mask_mod(doc_ids: Tensor, anchors: Tensor, block_size: int):
    """mask_mod(b, h, q_idx, kv_idx) of the rule above for anchors [B, A]; indices may be
    tensors of any broadcastable shapes (the dense path's grids)."""
    L = doc_ids.shape[1]
    lo, hi = context_ranges(doc_ids, anchors)

    def mask_mod(b, h, q_idx, kv_idx):
        slot = q_idx // block_size
        in_context = kv_idx < L
        sees_context = in_context & (kv_idx >= lo[b, slot]) & (kv_idx < hi[b, slot])
        sees_block = ~in_context & ((kv_idx - L) // block_size == slot)
        return sees_context | sees_block
    return mask_mod


def _ordered(blocks: Tensor) -> tuple[Tensor, Tensor]:
    """[B, nq, nkv] bool -> (counts [B, 1, nq], indices [B, 1, nq, nkv]) as BlockMask
    wants them: each query block's kv blocks first, in order."""
    counts = blocks.sum(-1, dtype=torch.int32)
    indices = torch.argsort((~blocks).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return counts[:, None], indices[:, None]


def block_mask(doc_ids: Tensor, anchors: Tensor, block_size: int) -> BlockMask:
    """flex_attention's BlockMask of the rule, from the slots' context ranges.

    A query block needs the context blocks over the hull of its slots' ranges and the
    key blocks of its slots' own tokens; a context block inside every one of its queries'
    ranges is full (skips mask_mod), the others are partial.
    """
    B, L = doc_ids.shape
    A = anchors.shape[1]
    Q = A * block_size
    nq, nkv = -(-Q // BLOCK), -(-(L + Q) // BLOCK)
    dev = doc_ids.device
    lo, hi = context_ranges(doc_ids, anchors)
    slot = torch.arange(nq * BLOCK, device=dev).clamp(max=Q - 1) // block_size
    lo_q, hi_q = (t[:, slot].view(B, nq, BLOCK) for t in (lo, hi))
    any_lo, any_hi = lo_q.amin(-1), hi_q.amax(-1)  # the hull of the block's ranges
    all_lo, all_hi = lo_q.amax(-1), hi_q.amin(-1)  # what every query of it sees
    first_slot, last_slot = slot.view(nq, BLOCK)[:, 0], slot.view(nq, BLOCK)[:, -1]

    key = torch.arange(nkv, device=dev) * BLOCK  # each kv block's first key
    key_end = key + BLOCK
    ctx_end = key_end.clamp(max=L)  # its context keys: [key, ctx_end), if key < L
    sees_context = ((key < L) & (key < any_hi[..., None]) & (ctx_end > any_lo[..., None])
                    & (any_hi > any_lo)[..., None])
    own_lo = L + first_slot * block_size  # the block's slots' own keys: [own_lo, own_hi)
    own_hi = L + (last_slot + 1) * block_size
    sees_own = (key_end > L) & (key[None] < own_hi[:, None]) & (key_end[None] > own_lo[:, None])
    full = ((key_end <= L) & (key >= all_lo[..., None]) & (key_end <= all_hi[..., None]))
    partial = (sees_context | sees_own) & ~full
    mask = BlockMask.from_kv_blocks(*_ordered(partial), *_ordered(full), BLOCK_SIZE=BLOCK,
                                    mask_mod=block_mask_mod(doc_ids, anchors, block_size),
                                    seq_lengths=(Q, L + Q))
    return with_dynamic_block_counts(mask)


class BlockLayout:
    """One batch's anchors and sample boundaries, prepared once for every draft layer."""

    def __init__(self, doc_ids: Tensor, anchors: Tensor, block_size: int,
                 use_flex: bool | None = None):
        self.use_flex = doc_ids.is_cuda if use_flex is None else use_flex
        B, L = doc_ids.shape
        Q = anchors.shape[1] * block_size
        self.divisible = Q % BLOCK == 0 and L % BLOCK == 0
        if self.use_flex:
            self.mask: BlockMask | Tensor = block_mask(doc_ids, anchors, block_size)
        else:
            b = torch.arange(B, device=doc_ids.device)[:, None, None]
            q = torch.arange(Q, device=doc_ids.device)[None, :, None]
            kv = torch.arange(L + Q, device=doc_ids.device)[None, None]
            self.mask = block_mask_mod(doc_ids, anchors, block_size)(b, None, q, kv)


def block_attention(q: Tensor, k: Tensor, v: Tensor, layout: BlockLayout) -> Tensor:
    """q [B, Hq, Q, D] over k, v [B, Hkv, L + Q, D] -> [B, Hq, Q, D]."""
    if not layout.use_flex:
        return dense_attention(q, k, v, layout.mask)
    attend = compiled_flex() if q.is_cuda else flex_attention
    return attend(q, k, v, block_mask=layout.mask, enable_gqa=True,
                  kernel_options=flex_kernel_options(q, layout.divisible))
