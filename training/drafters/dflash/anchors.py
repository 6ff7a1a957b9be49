"""Where the blocks of a packed row start: random anchors at valid positions."""
from __future__ import annotations

import torch
from torch import Tensor

from training.params import anchor_room


def valid_anchors(loss_mask: Tensor, doc_ids: Tensor, block_size: int) -> Tensor:
    """[B, L] bool: position p may anchor a block if it bears loss and the block's last
    position p + block_size - 1 lies in the same sample (a block never reads or scores
    tokens of the next sample or padding)."""
    B, L = doc_ids.shape
    room = anchor_room(L, block_size)
    end = torch.full_like(doc_ids, -1)
    if room > 0:
        end[:, :room] = doc_ids[:, block_size - 1:]
    return loss_mask & (end == doc_ids) & (doc_ids >= 0)


def sample_anchors(loss_mask: Tensor, doc_ids: Tensor, block_size: int,
                   max_anchors: int, share: tuple[int, int] = (0, 1)) -> tuple[Tensor, Tensor]:
    """Up to max_anchors distinct valid anchors per row, drawn uniformly with torch's RNG
    on the rows' device (a resumed run restores it, so it draws the same anchors).

    share (rank, world size): the rows are rank's slice of a global batch of world size
    times as many. Every rank draws for the whole global batch and keeps its slice, so
    the ranks' generators stay in step and N ranks draw exactly the anchors that one
    process given the global batch would.

    Returns anchors [B, max_anchors] long and used [B, max_anchors] bool. Every row has
    max_anchors slots whatever it holds, so the shapes (and a compiled graph) do not change
    from batch to batch; a slot past the row's valid positions is unused, anchored at 0.
    Used slots come first, in position order: neighbouring blocks read overlapping
    context, which keeps a block-sparse mask's blocks few.
    """
    B, L = doc_ids.shape
    if not 1 <= max_anchors <= L:
        raise ValueError(f"max_anchors must be in 1..{L} (the row length), got {max_anchors}")
    valid = valid_anchors(loss_mask, doc_ids, block_size)
    rank, world = share
    draw = torch.rand(world * B, L, device=doc_ids.device)[rank * B:(rank + 1) * B]
    draw = draw.masked_fill(~valid, -1.0)
    picked = draw.topk(max_anchors, dim=1)
    used = picked.values >= 0
    order = torch.where(used, picked.indices, L).sort(dim=1)
    used = order.values < L
    return torch.where(used, order.values, 0), used
