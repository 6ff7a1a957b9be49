"""flex_attention as both drafters' attention runs it, and its exact dense reference: the
compiled kernel and its options, block masks whose counts are marked dynamic, each
token's sample start, and the float32-or-wider dtype softmaxes and norms run in."""
from __future__ import annotations

import functools
import math

import torch
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from training.compiled import compiler_imported


def doc_starts(doc_ids: Tensor) -> Tensor:
    """[B, L] index of the first token of each token's sample (padding counts as one)."""
    idx = torch.arange(doc_ids.shape[1], device=doc_ids.device).expand_as(doc_ids)
    is_start = torch.ones_like(doc_ids, dtype=torch.bool)
    is_start[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    return torch.where(is_start, idx, 0).cummax(dim=1).values


def at_least_float32(dtype: torch.dtype) -> torch.dtype:
    """Softmaxes and norms run in float32 for bf16 activations, float64 for float64 ones."""
    return torch.promote_types(dtype, torch.float32)


# The BlockMask's index tensors, whose block-count dimensions with_dynamic_block_counts
# marks dynamic.
_BLOCK_TENSORS = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
                  "q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices")


def with_dynamic_block_counts(mask: BlockMask) -> BlockMask:
    """mask with its block counts marked dynamic. Left static, they would key the compiled
    flex graphs to this row length: a launch at a new max_seq_len would compile flex again
    instead of finding it in inductor's disk cache. A view is guarded on its base's
    strides too, so each tensor marked must own its storage."""
    for name in _BLOCK_TENSORS:
        t = getattr(mask, name)
        if t is None:
            continue
        t = t.clone() if t._base is not None else t
        for dim in range(2, t.dim()):
            torch._dynamo.maybe_mark_dynamic(t, dim)
        setattr(mask, name, t)
    return mask


def dense_attention(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor) -> Tensor:
    """Exact reference: q [B,Hq,L,D], k/v [B,Hkv,S,D], allowed [B,L,S] -> [B,Hq,L,D]."""
    B, Hq, L, D = q.shape
    Hkv = k.shape[1]
    qg = q.reshape(B, Hkv, Hq // Hkv, L, D)  # query heads that share one key/value head
    acc = at_least_float32(q.dtype)
    scores = (qg @ k.unsqueeze(2).transpose(-1, -2)).to(acc) * (1.0 / math.sqrt(D))
    scores = scores.masked_fill(~allowed[:, None, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(v.dtype)
    return (probs @ v.unsqueeze(2)).reshape(B, Hq, L, D)


@functools.cache
def compiled_flex():
    # Dynamic shapes: one kernel for every row length, found in inductor's on-disk cache
    # by a relaunch with a new max_seq_len, whose first step then skips the compile
    # (docs/benchmarks.md, "The first step at a new max_seq_len").
    compiler_imported()
    return torch.compile(flex_attention, dynamic=True)


def flex_kernel_options(q: Tensor, divisible: bool = True) -> dict | None:
    """What flex_attention cannot see for itself on CUDA: whether the rows are whole blocks
    (divisible: their length is symbolic, so inductor would otherwise mask every load at
    the edges).
    Not ROWS_GUARANTEED_SAFE, though every query sees itself: with it the H200 gave NaN
    (likely because a query whose sample starts inside its kv block has no key in the
    first block the kernel visits). On Hopper (sm90), for head_dim up to 128, the backward
    tiles a sweep found faster than inductor's default. Measured in docs/benchmarks.md,
    "The diagonal-key fold in Triton, flex's sm90 tiles" and "flex told its rows are whole blocks"."""
    if not q.is_cuda:
        return None
    options = {"IS_DIVISIBLE": True} if divisible else {}
    if q.shape[-1] <= 128 and torch.cuda.get_device_capability(q.device)[0] == 9:
        options |= {"bwd_BLOCK_M1": 64, "bwd_BLOCK_N1": 128, "bwd_BLOCK_M2": 128,
                    "bwd_BLOCK_N2": 64, "bwd_num_stages": 2, "bwd_num_warps": 8}
    return options
