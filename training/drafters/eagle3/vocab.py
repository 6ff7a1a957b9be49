"""The draft vocabulary: the target tokens the drafter can propose."""
from __future__ import annotations

import torch
from torch import Tensor

DEFAULT_DRAFT_VOCAB_SIZE = 32000


def default_draft_vocab_size(vocab_size: int) -> int:
    return min(DEFAULT_DRAFT_VOCAB_SIZE, vocab_size)


def build_draft_vocab(token_counts: Tensor, draft_vocab_size: int) -> tuple[Tensor, Tensor]:
    """The draft_vocab_size most frequent loss-bearing tokens, ties to the lower id.

    Returns d2t [draft] long, the absolute target ids in ascending order, and t2d [vocab]
    bool, true for target ids in the draft vocabulary.
    """
    vocab = token_counts.shape[0]
    if not 0 < draft_vocab_size <= vocab:
        raise ValueError(f"draft_vocab_size must be in 1..{vocab}, got {draft_vocab_size}")
    # A stable sort on descending counts keeps equal counts in id order.
    order = torch.sort(-token_counts.to(torch.float64), stable=True).indices
    d2t = torch.sort(order[:draft_vocab_size]).values
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[d2t] = True
    return d2t, t2d
