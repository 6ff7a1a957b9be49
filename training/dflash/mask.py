"""Who sees whom in a DFlash pass over a packed row.

Queries are the blocks' tokens, slot-major: query q is offset q % block_size of the block
in anchor slot q // block_size. Keys are the row's L context positions (the verifier's
hidden states) followed by the same block tokens. A query sees the context of its own
sample strictly before its anchor (what the verifier has computed when the block is
drafted: the anchor is the token it has just emitted) and every token of its own block,
in both directions; never another block, another sample or padding.

Two implementations of one rule: a dense [B, Q, L + Q] mask for the CPU and short rows,
and flex_attention's BlockMask for CUDA, made from the same mask_mod.
"""
from __future__ import annotations

import functools

import torch
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

from training.attention import dense_attention


def block_mask_mod(doc_ids: Tensor, anchors: Tensor, block_size: int):
    """mask_mod(b, h, q_idx, kv_idx) of the rule above for anchors [B, A]; indices may be
    tensors of any broadcastable shapes (the dense path's grids)."""
    L = doc_ids.shape[1]

    def mask_mod(b, h, q_idx, kv_idx):
        slot = q_idx // block_size
        anchor = anchors[b, slot]
        in_context = kv_idx < L
        ctx_pos = torch.where(in_context, kv_idx, 0)
        sees_context = in_context & (ctx_pos < anchor) & (doc_ids[b, ctx_pos]
                                                          == doc_ids[b, anchor])
        sees_block = ~in_context & ((kv_idx - L) // block_size == slot)
        return sees_context | sees_block
    return mask_mod


@functools.cache
def _compiled(fn):
    return torch.compile(fn, dynamic=True)


class BlockLayout:
    """One batch's anchors and sample boundaries, prepared once for every draft layer."""

    def __init__(self, doc_ids: Tensor, anchors: Tensor, block_size: int,
                 use_flex: bool | None = None):
        self.use_flex = doc_ids.is_cuda if use_flex is None else use_flex
        B, L = doc_ids.shape
        Q = anchors.shape[1] * block_size
        rule = block_mask_mod(doc_ids, anchors, block_size)
        if self.use_flex:
            make = _compiled(create_block_mask) if doc_ids.is_cuda else create_block_mask
            self.mask: BlockMask | Tensor = make(rule, B, None, Q, L + Q,
                                                 device=doc_ids.device)
        else:
            b = torch.arange(B, device=doc_ids.device)[:, None, None]
            q = torch.arange(Q, device=doc_ids.device)[None, :, None]
            kv = torch.arange(L + Q, device=doc_ids.device)[None, None]
            self.mask = rule(b, None, q, kv)


def block_attention(q: Tensor, k: Tensor, v: Tensor, layout: BlockLayout) -> Tensor:
    """q [B, Hq, Q, D] over k, v [B, Hkv, L + Q, D] -> [B, Hq, Q, D]."""
    if not layout.use_flex:
        return dense_attention(q, k, v, layout.mask)
    attend = _compiled(flex_attention) if q.is_cuda else flex_attention
    return attend(q, k, v, block_mask=layout.mask, enable_gqa=True)
