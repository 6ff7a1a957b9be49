"""Packing samples into rows of exactly max_seq_len tokens.

Position ids restart at every sample and doc_ids tell the attention where samples begin,
so a packed row computes exactly what its samples would compute one by one.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, fields

import torch
from torch import Tensor

Sample = dict[str, Tensor]  # input_ids [n], loss_mask [n], aux_hidden [n,3H], final_hidden [n,H]
SAMPLE_KEYS = ("input_ids", "loss_mask", "aux_hidden", "final_hidden")
# the verifier's argmax at each position; data extracted before it was stored lacks it
VERIFIER_IDS = "verifier_ids"


def plan_rows(lengths: list[int], max_seq_len: int) -> list[list[int]]:
    """Best-fit decreasing: which sample indices fill which row.

    Longest first, each into the row with the least room that still fits it; ties go to
    the lower sample index and the older row, so the plan is a function of its inputs.
    A sample longer than a row takes a row of its own (collate truncates it).
    """
    if max_seq_len <= 0:
        raise ValueError(f"max_seq_len must be positive, got {max_seq_len}")
    order = sorted(range(len(lengths)), key=lambda i: (-min(lengths[i], max_seq_len), i))
    rows: list[list[int]] = []
    free: list[tuple[int, int]] = []  # (room left, row index), sorted
    for i in order:
        n = min(lengths[i], max_seq_len)
        if n <= 0:
            raise ValueError(f"sample {i} is empty")
        at = bisect.bisect_left(free, (n, -1))
        if at < len(free):
            room, r = free.pop(at)
        else:
            room, r = max_seq_len, len(rows)
            rows.append([])
        rows[r].append(i)
        if room - n > 0:
            bisect.insort(free, (room - n, r))
    return rows


@dataclass
class PackedBatch:
    input_ids: Tensor  # [B, L] long
    position_ids: Tensor  # [B, L] long, restarting at 0 in every sample
    doc_ids: Tensor  # [B, L] long, sample index within the row; -1 = padding
    loss_mask: Tensor  # [B, L] bool
    aux_hidden: Tensor  # [B, L, 3H]
    final_hidden: Tensor  # [B, L, H]
    num_samples: int
    num_truncated: int
    pad_tokens: int
    # [B, L] long: the verifier's argmax at each position (its next token), when every
    # sample of the batch carries it; a DFlash step without the soft KL needs no more
    verifier_ids: Tensor | None = None

    @property
    def samples_per_row(self) -> float:
        return self.num_samples / self.input_ids.shape[0]

    @property
    def pad_frac(self) -> float:
        return self.pad_tokens / self.input_ids.numel()

    def to(self, device: torch.device | str, non_blocking: bool = False) -> PackedBatch:
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        for name, value in moved.items():
            if isinstance(value, Tensor):
                moved[name] = value.to(device, non_blocking=non_blocking)
        return PackedBatch(**moved)


def collate(rows: list[list[Sample]], max_seq_len: int, pin_memory: bool = False) -> PackedBatch:
    """Concatenate each row's samples and pad it to exactly max_seq_len tokens.

    pin_memory: into page-locked host memory, which a CUDA device copies from at full
    speed and without the CPU staging it (a pageable tensor is copied twice, synchronously).
    """
    if not rows or not all(rows):
        raise ValueError("collate needs at least one row and no empty rows")
    first = rows[0][0]
    L = max_seq_len
    B = len(rows)
    hidden = first["final_hidden"].shape[-1]
    pinned = dict(pin_memory=pin_memory)
    out = PackedBatch(
        input_ids=torch.zeros(B, L, dtype=torch.long, **pinned),
        position_ids=torch.zeros(B, L, dtype=torch.long, **pinned),
        doc_ids=torch.full((B, L), -1, dtype=torch.long, **pinned),
        loss_mask=torch.zeros(B, L, dtype=torch.bool, **pinned),
        aux_hidden=torch.zeros(B, L, first["aux_hidden"].shape[-1],
                               dtype=first["aux_hidden"].dtype, **pinned),
        final_hidden=torch.zeros(B, L, hidden, dtype=first["final_hidden"].dtype, **pinned),
        num_samples=0, num_truncated=0, pad_tokens=0,
        verifier_ids=(torch.zeros(B, L, dtype=torch.long, **pinned)
                      if all(VERIFIER_IDS in s for row in rows for s in row) else None))
    for b, row in enumerate(rows):
        at = 0
        for d, sample in enumerate(row):
            missing = [k for k in SAMPLE_KEYS if k not in sample]
            if missing:
                raise ValueError(f"sample lacks {', '.join(missing)}")
            n = sample["input_ids"].shape[0]
            if n > L:
                out.num_truncated += 1
                n = L
            if at + n > L:
                raise ValueError(f"row {b} holds {at + n}+ tokens, more than max_seq_len {L}")
            span = slice(at, at + n)
            out.input_ids[b, span] = sample["input_ids"][:n]
            out.loss_mask[b, span] = sample["loss_mask"][:n]
            out.aux_hidden[b, span] = sample["aux_hidden"][:n]
            out.final_hidden[b, span] = sample["final_hidden"][:n]
            if out.verifier_ids is not None:
                out.verifier_ids[b, span] = sample[VERIFIER_IDS][:n]
            out.position_ids[b, span] = torch.arange(n)
            out.doc_ids[b, span] = d
            out.num_samples += 1
            at += n
        out.pad_tokens += L - at
    return out
