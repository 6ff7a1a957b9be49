"""The DFlash drafter: draft layers that fill blocks of mask tokens, reading the
verifier's hidden states as context.

The hidden states of several verifier layers are concatenated and projected to one
context stream (fc, hidden_norm). Every draft layer attends from the blocks' tokens over
that context's keys and values followed by the blocks' own (one k_proj and v_proj for
both, as the drafter runs at serving time), under the BlockLayout rule. A block is the
anchor's token and block_size - 1 mask tokens; offset k of the block at anchor p is scored
against the verifier's token at p + k, with weight exp(-(k - 1) / γ). The verifier's
embedding and head are shared and frozen; the drafter owns no vocabulary-sized weight.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor, nn

from training.flex import at_least_float32
from training.config import DFlashConfig
from training.device import onto
from training.drafters.dflash.anchors import sample_anchors
from training.drafters.dflash.loss import block_loss, verifier_tokens
from training.drafters.dflash.mask import BlockLayout, block_attention
from training.fp8 import Fp8Weight, FrozenFp8, fp8_linear, fp8_weights
from training.layers import MLP, RMSNorm, norm_rope, rotary_tables
from training.packing import PackedBatch


class DFlashAttention(nn.Module):
    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        self.cfg = cfg
        H, d = cfg.hidden_size, cfg.head_dim
        self.q_proj = nn.Linear(H, cfg.num_heads * d, bias=False)
        self.k_proj = nn.Linear(H, cfg.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(H, cfg.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * d, H, bias=False)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps)

    def fp8_groups(self) -> list[tuple[Tensor, ...]]:
        """Its weights as fp8_weights takes them: q; k and v stacked (one matmul of their
        input: one cast of it, one of its gradient); o."""
        return [(self.q_proj.weight,), (self.k_proj.weight, self.v_proj.weight),
                (self.o_proj.weight,)]

    def forward(self, x: Tensor, context: Tensor, rotary: tuple[Tensor, Tensor],
                layout: BlockLayout, weights: tuple[Fp8Weight, ...] | None) -> Tensor:
        """x [B, Q, H] the blocks' stream, context [B, L, H]; rotary: the tables of the
        keys' positions (context's, then the blocks'), whose last Q are the queries'.
        weights: fp8_groups()' Fp8Weights, or None in bf16."""
        B, Q, _ = x.shape
        d = self.cfg.head_dim
        q_w, kv_w, o_w = weights or (None, None, None)
        q_rotary = tuple(t[:, -Q:] for t in rotary)
        q = norm_rope(_project(self.q_proj, x, q_w).view(B, Q, -1, d), self.q_norm.weight,
                      self.q_norm.eps, *q_rotary)
        both = torch.cat([context.to(x.dtype), x], dim=1)
        L = both.shape[1]
        if kv_w is None:  # each made as it is read: not both outputs at once
            k = norm_rope(self.k_proj(both).view(B, L, -1, d), self.k_norm.weight,
                          self.k_norm.eps, *rotary)
            v = self.v_proj(both).view(B, L, -1, d)
        else:
            k, v = fp8_linear(both, kv_w).chunk(2, dim=-1)
            # v as a view would keep k's columns alive as long as attention keeps v
            k = norm_rope(k.view(B, L, -1, d), self.k_norm.weight, self.k_norm.eps, *rotary)
            v = v.contiguous().view(B, L, -1, d)
        out = block_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), layout)
        return _project(self.o_proj, out.transpose(1, 2).reshape(B, Q, -1), o_w)


def _project(linear: nn.Linear, x: Tensor, w: Fp8Weight | None) -> Tensor:
    """x through linear, or through its Fp8Weight w as an fp8 matmul."""
    return linear(x) if w is None else fp8_linear(x, w)


class DFlashLayer(nn.Module):
    def __init__(self, cfg: DFlashConfig, fp8: bool = False):
        super().__init__()
        H, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.input_layernorm = RMSNorm(H, eps)
        self.self_attn = DFlashAttention(cfg)
        self.post_attention_layernorm = RMSNorm(H, eps)
        self.mlp = MLP(cfg, fp8)

    def forward(self, x: Tensor, context: Tensor, rotary: tuple[Tensor, Tensor],
                layout: BlockLayout) -> Tensor:
        # fp8: the layer's weights cast in one call, here, where FSDP has gathered them
        # (each layer is a group of its own: training/drafters/dflash/step.py)
        attn_weights, mlp_weights = (
            fp8_weights([self.self_attn.fp8_groups(), self.mlp.fp8_groups()]) if self.mlp.fp8
            else (None, self.mlp.unroll_weights()))
        x = x + self.self_attn(self.input_layernorm(x), context, rotary, layout, attn_weights)
        return x + self.mlp(self.post_attention_layernorm(x), mlp_weights)


def position_weights(block_size: int, gamma: float) -> list[float]:
    """exp(-(k - 1) / γ) for block offsets k = 1..block_size - 1 (offset 0 is the anchor,
    given, not drafted)."""
    return [math.exp(-(k - 1) / gamma) for k in range(1, block_size)]


@dataclass
class BlockLosses:
    """A pass's scored positions: what backward needs, and per position for reporting."""
    total: Tensor  # Σ weight · loss over the positions, differentiable
    losses: Tensor  # [P] float32, not differentiable
    agree: Tensor  # [P] bool: the drafter's argmax is the verifier's
    offset: Tensor  # [P] long: each position's offset in its block, 1..block_size - 1
    counts: list[int]  # positions scored at each offset 1..block_size - 1


class DFlashDrafter(nn.Module):
    def __init__(self, cfg: DFlashConfig, fp8: bool = False):
        """fp8: the layers' matmuls in fp8 (training/fp8.py), and the loss's gradient
        through the verifier's head."""
        super().__init__()
        self.cfg, self.fp8 = cfg, fp8
        H = cfg.hidden_size
        self.fc = nn.Linear(cfg.num_target_layers * H, H, bias=False)
        self.hidden_norm = RMSNorm(H, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashLayer(cfg, fp8) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(H, cfg.rms_norm_eps)
        # The verifier's, set by load_verifier; not persistent: a checkpoint holds the
        # drafter's own weights only.
        self.register_buffer("embed_tokens", torch.zeros(cfg.vocab_size, H), persistent=False)
        self.register_buffer("lm_head", torch.zeros(cfg.vocab_size, H), persistent=False)
        self.head_fp8 = FrozenFp8()  # the head as the loss's fp8 gradient reads it
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)

    @torch.no_grad()
    def load_verifier(self, embed_tokens: Tensor, lm_head: Tensor) -> None:
        shape = (self.cfg.vocab_size, self.cfg.hidden_size)
        for name, t in (("embed_tokens", embed_tokens), ("lm_head", lm_head)):
            if tuple(t.shape) != shape:
                raise ValueError(f"verifier {name} has shape {tuple(t.shape)}, "
                                 f"the drafter config wants {shape}")
        # Kept in the verifier's dtype (bf16 as extracted): frozen, an fp32 copy adds nothing.
        device = self.fc.weight.device
        self.embed_tokens = embed_tokens.to(device)
        self.lm_head = lm_head.to(device)

    def forward(self, batch: PackedBatch, context_hidden: Tensor, max_anchors: int,
                gamma: float, soft_kl: float = 0.0, loss_chunk: int = 2048,
                share: tuple[int, int] = (0, 1), plan: BlockPlan | None = None
                ) -> BlockLosses:
        """Draft every block of the batch's plan in one pass, score it.

        context_hidden [B, L, num_target_layers · H]: the verifier layers this drafter
        reads, concatenated (a selection of the data's aux_hidden). share: (rank, world
        size) of the process whose slice of the global batch this is (sample_anchors).
        plan: plan_blocks of the batch, made where the batch was made (the training step
        makes it on the host); None: drawn here, of max_anchors and share.
        """
        cfg, bs = self.cfg, self.cfg.block_size
        ids, doc = batch.input_ids, batch.doc_ids
        plan = plan or plan_blocks(batch, bs, max_anchors, share, soft_kl)
        anchors, offset, draft_rows, verifier_rows = (plan.anchors, plan.offset,
                                                      plan.draft_rows, plan.verifier_rows)
        offsets = torch.arange(bs, device=ids.device)
        at = anchors[..., None] + offsets  # [B, A, bs] row positions of the blocks' tokens
        weights = _position_weights(bs, gamma, ids.device)[offset - 1]
        final_hidden = batch.final_hidden.flatten(0, 1)
        if soft_kl:
            target = final_hidden.index_select(0, verifier_rows)
        elif batch.verifier_ids is not None:  # kept by the extraction's forward
            target = batch.verifier_ids.flatten().index_select(0, verifier_rows)
        else:
            dtype = (torch.get_autocast_dtype(ids.device.type)
                     if torch.is_autocast_enabled(ids.device.type) else self.fc.weight.dtype)
            target = verifier_tokens(final_hidden, plan.distinct_verifier_rows,
                                     self.lm_head, dtype, loss_chunk)

        tokens = torch.full_like(at, cfg.mask_token_id)
        tokens[..., 0] = ids.gather(1, anchors)
        x = self.embed_tokens[tokens.flatten(1)]
        if not torch.is_autocast_enabled(x.device.type):
            x = x.to(self.fc.weight.dtype)
            context_hidden = context_hidden.to(self.fc.weight.dtype)
        context = self.hidden_norm(self.fc(context_hidden))

        block_pos = (batch.position_ids.gather(1, anchors)[..., None] + offsets).flatten(1)
        rotary = rotary_tables(torch.cat([batch.position_ids, block_pos], dim=1),
                               cfg.head_dim, cfg.rope_theta,
                               at_least_float32(self.fc.weight.dtype))
        layout = BlockLayout(doc, anchors, bs)
        for layer in self.layers:
            x = layer(x, context, rotary, layout)

        total, losses, agree = block_loss(
            self.norm(x.flatten(0, 1).index_select(0, draft_rows)), self.lm_head, target,
            weights, soft_kl, loss_chunk, self.head_fp8(self.lm_head) if self.fp8 else None)
        return BlockLosses(total, losses, agree, offset, plan.counts)


class BlockPlan(NamedTuple):
    """Where a batch's blocks go and which of their positions are scored: all of a step
    that follows from the anchors, whose sizes (the scored positions) the CPU must know
    to queue the step. Made on the device, reading them back would wait for the GPU to
    finish all it was given (the step before's optimizer): the training step makes it on
    the host, from the batch as the loader made it, then hands it over (`onto`)."""
    anchors: Tensor  # [B, A] long: each slot's anchor (an unused slot's is 0)
    offset: Tensor  # [P] long: each scored position's offset in its block, 1..bs - 1
    draft_rows: Tensor  # [P]: its row among the blocks' tokens, [B · A · bs]
    verifier_rows: Tensor  # [P]: the row of the verifier's state before it, [B · L]
    # torch.unique's of verifier_rows, where the step makes the verifier's tokens there
    distinct_verifier_rows: tuple[Tensor, Tensor] | None
    counts: list[int]  # positions scored at each offset 1..bs - 1

    def onto(self, device: torch.device) -> BlockPlan:
        distinct = self.distinct_verifier_rows
        return BlockPlan(*(onto(t, device) for t in self[:4]),
                         distinct and tuple(onto(t, device) for t in distinct), self.counts)


def plan_blocks(batch: PackedBatch, block_size: int, max_anchors: int,
                share: tuple[int, int] = (0, 1), soft_kl: float = 0.0) -> BlockPlan:
    """Draw the batch's anchors (sample_anchors, on the batch's device) and place its
    scored positions. Offset k of a used block is scored where its token bears loss; the
    verifier's token there is its argmax at the position before (valid anchors keep the
    whole block inside the sample). The step makes those tokens itself where it scores
    no soft KL and the batch carries none."""
    L = batch.doc_ids.shape[1]
    anchors, used = sample_anchors(batch.loss_mask, batch.doc_ids, block_size, max_anchors,
                                   share)
    at = anchors[..., None] + torch.arange(block_size, device=anchors.device)
    scored = used[..., None] & batch.loss_mask.gather(1, at.clamp(max=L - 1).flatten(1)
                                                      ).view_as(at)
    scored[..., 0] = False
    rows, slot, offset = scored.nonzero().unbind(1)
    counts = torch.bincount(offset, minlength=block_size)[1:].tolist()
    verifier_rows = rows * L + at[scored] - 1
    makes_tokens = not soft_kl and batch.verifier_ids is None
    return BlockPlan(anchors, offset, (rows * anchors.shape[1] + slot) * block_size + offset,
                     verifier_rows,
                     torch.unique(verifier_rows, return_inverse=True) if makes_tokens else None,
                     counts)


@functools.cache
def _position_weights(block_size: int, gamma: float, device: torch.device) -> Tensor:
    # made once per device: a tensor made from a list each step is a copy the CPU waits on
    return torch.tensor(position_weights(block_size, gamma), device=device)
