"""The EAGLE-3 drafter and its training-time-test (TTT) unroll.

Parameter names follow the EAGLE-3 checkpoint layout (fc, midlayer.*, norm, lm_head, d2t,
t2d) so an export is a rename-free copy of the state dict.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.utils.checkpoint
from torch import Tensor, nn

from training.compiled import cuda_compiled
from training.config import DrafterConfig
from training.device import onto
from training.drafters.eagle3.attention import DocLayout, ttt_attention
from training.drafters.eagle3.loss import soft_cross_entropy, verifier_targets
from training.flex import at_least_float32
from training.fp8 import Fp8Weight, FrozenFp8, fp8_linear, fp8_weights
from training.layers import MLP, RMSNorm, normalise, rope, rotary_tables
from training.packing import PackedBatch
from training.params import PARAMS


@cuda_compiled
def side_by_side_norms(a: Tensor, b: Tensor, weight_a: Tensor, weight_b: Tensor,
                       eps: float) -> Tensor:
    """[rms_norm(a) ; rms_norm(b)] in one island: the norms write the concatenation's
    halves, and backward takes its gradient whole. Two compiled norms and a cat wrote both
    halves twice, and each norm's backward, handed a strided half of the gradient, copied
    it first: two [tokens x hidden] copies per TTT step (docs/benchmarks.md,
    "The loss's chunk pass in Triton, three copies gone")."""
    return torch.cat([normalise(a, weight_a, eps), normalise(b, weight_b, eps)], dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.cfg = cfg
        H2, d = 2 * cfg.hidden_size, cfg.head_dim
        self.q_proj = nn.Linear(H2, cfg.num_heads * d, bias=False)
        self.k_proj = nn.Linear(H2, cfg.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(H2, cfg.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * d, cfg.hidden_size, bias=False)

    def fp8_groups(self) -> list[tuple[Tensor, ...]]:
        """Its weights as fp8_weights takes them: q, k and v stacked (one matmul of x), and
        o."""
        return [(self.q_proj.weight, self.k_proj.weight, self.v_proj.weight), (self.o_proj.weight,)]

    def forward(self, x: Tensor, rotary: tuple[Tensor, Tensor], layout: DocLayout,
                earlier: list[tuple[Tensor, Tensor]],
                weights: tuple[Fp8Weight, ...] | None) -> tuple[Tensor, Tensor, Tensor]:
        """rotary: the step's rotary_tables. earlier: the keys and values of the TTT steps
        before this one (step 0's first). weights: fp8_groups()' Fp8Weights, made once per
        unroll; None in bf16, where autocast's cache casts each weight once. Returns the output
        and this step's keys and values."""
        B, L, _ = x.shape
        d = self.cfg.head_dim
        # [B, heads, L, D] views of token-major [B, L, heads, D] tensors: flex_attention
        # and the fold write their outputs and q's gradient in q's layout, so the heads
        # merge back into o_proj's input, and q's gradient into q_proj's, without a copy
        # (head-major layout copied each of them per TTT step: docs/benchmarks.md,
        # "The loss's chunk pass in Triton, three copies gone").
        if weights is None:  # each projection made as it is read: at 131,072 tokens q's is GiBs
            q = rope(self.q_proj(x).view(B, L, -1, d), *rotary)
            k = rope(self.k_proj(x).view(B, L, -1, d), *rotary)
            v = self.v_proj(x).view(B, L, -1, d)
        else:
            q, k, v = (t.view(B, L, -1, d) for t in fp8_linear(x, weights[0]).split(
                [p.out_features for p in (self.q_proj, self.k_proj, self.v_proj)], dim=-1))
            # v is kept by later TTT steps and by attention's backward: as a view it would
            # keep q's and k's columns of the stacked output alive with it
            q, k, v = rope(q, *rotary), rope(k, *rotary), v.contiguous()
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        out = ttt_attention(q, [ek for ek, _ in earlier] + [k], [ev for _, ev in earlier] + [v],
                            layout).transpose(1, 2).reshape(B, L, -1)
        return (self.o_proj(out) if weights is None else fp8_linear(out, weights[1])), k, v


class DecoderLayer(nn.Module):
    """EAGLE-3's one layer: attention reads [norm(token embedding) ; norm(hidden)]."""

    def __init__(self, cfg: DrafterConfig, fp8: bool = False):
        super().__init__()
        H, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.input_layernorm = RMSNorm(H, eps)
        self.hidden_norm = RMSNorm(H, eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(H, eps)
        self.mlp = MLP(cfg, fp8)

    def unroll_weights(self) -> tuple:
        """The attention's and the MLP's weights as they read them, made once per unroll:
        in fp8, every projection's in one call."""
        if self.mlp.fp8:
            return tuple(fp8_weights([self.self_attn.fp8_groups(), self.mlp.fp8_groups()]))
        return None, self.mlp.unroll_weights()

    def forward(self, embeds: Tensor, hidden: Tensor, rotary: tuple[Tensor, Tensor],
                layout: DocLayout, earlier: list[tuple[Tensor, Tensor]], weights: tuple
                ) -> tuple[Tensor, Tensor, Tensor]:
        """weights: unroll_weights()."""
        # In the hidden stream's dtype (bf16 under autocast), so q/k/v share one cast input.
        # The two norms run as one island (their modules hold the weights, under the
        # checkpoint's names); they share the config's eps.
        x = side_by_side_norms(embeds.to(hidden.dtype), hidden, self.input_layernorm.weight,
                               self.hidden_norm.weight, self.hidden_norm.eps)
        attn_weights, mlp_weights = weights
        attn, k, v = self.self_attn(x, rotary, layout, earlier, attn_weights)
        hidden = hidden + attn
        return hidden + self.mlp(self.post_attention_layernorm(hidden), mlp_weights), k, v


@dataclass
class DraftOutput:
    loss: Tensor  # sum_k decay^k * mean soft-CE at step k; what backward() is called on
    loss_ttt: list[Tensor]  # per-step mean loss, detached
    acc_ttt: list[Tensor]  # per-step share of positions whose argmax matches the verifier
    positions: list[int]  # positions that count at each step


@dataclass
class StepLoss:
    """One TTT step's results: what backward needs, and per position for reporting."""
    total: Tensor  # the sum of the losses, differentiable; weigh it with a scalar
    losses: Tensor  # [P] float32, not differentiable
    agree: Tensor  # [P] bool
    index: Tensor  # [P, 2] (row, column) of each position in the batch


def _shift(x: Tensor, s: int, fill) -> Tensor:
    """x[:, i + s] at column i; fill past the end of the row."""
    out = torch.full_like(x, fill)
    out[:, :-s] = x[:, s:]
    return out


def _same_docs(doc: Tensor, ttt_steps: int) -> list[Tensor]:
    """Per TTT step s = 1.., [B, L] bool: position i and i + s lie in one sample."""
    return [(_shift(doc, s, -1) == doc) & (doc >= 0) for s in range(1, ttt_steps + 1)]


class Positions(NamedTuple):
    """Every TTT step's scored positions: their sizes, which the CPU must know to queue
    the unroll. Made on the device, counting them would wait for all the GPU was given
    (the step before's optimizer): the training step makes them on the host, from the
    batch as the loader made it, and hands them over (`onto`)."""
    index: Tensor  # [P, 2] (row, column), TTT step by step
    counts: list[int]  # positions scored at each TTT step

    def onto(self, device: torch.device) -> Positions:
        return Positions(onto(self.index, device), self.counts)


def scored_positions(batch: PackedBatch, ttt_steps: int) -> Positions:
    """Index i holds the chain whose step k reads token x_{i+k+1} and is scored against
    the verifier at i+k+1; past its own sample nothing counts."""
    scored = torch.stack([same & _shift(batch.loss_mask, s, False) for s, same in
                          enumerate(_same_docs(batch.doc_ids, ttt_steps), 1)]).nonzero()
    counts = torch.bincount(scored[:, 0], minlength=ttt_steps).tolist()
    return Positions(scored[:, 1:], counts)


class Eagle3Drafter(nn.Module):
    def __init__(self, cfg: DrafterConfig, fp8: bool = False):
        """fp8: the layer's matmuls in fp8 (training/fp8.py), and a frozen head's gradient."""
        super().__init__()
        self.cfg, self.fp8 = cfg, fp8
        self.head_fp8 = FrozenFp8()  # a frozen head as the loss's fp8 gradient reads it
        H = cfg.hidden_size
        self.embed_tokens = nn.Embedding(cfg.vocab_size, H)
        self.embed_tokens.weight.requires_grad_(False)
        self.fc = nn.Linear(3 * H, H, bias=False)
        self.midlayer = DecoderLayer(cfg, fp8)
        self.norm = RMSNorm(H, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(H, cfg.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.arange(cfg.draft_vocab_size))
        self.register_buffer("t2d", torch.arange(cfg.vocab_size) < cfg.draft_vocab_size)
        # The verifier's head restricted to the draft vocabulary: it makes the targets.
        # Not persistent: it is the verifier's, and load_verifier restores it.
        self.register_buffer("target_head", torch.zeros(cfg.draft_vocab_size, H),
                             persistent=False)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)

    @torch.no_grad()
    def load_verifier(self, embed_tokens: Tensor, lm_head: Tensor, d2t: Tensor,
                      t2d: Tensor) -> None:
        V, H, D = self.cfg.vocab_size, self.cfg.hidden_size, self.cfg.draft_vocab_size
        for name, t, shape in (("embed_tokens", embed_tokens, (V, H)),
                               ("lm_head", lm_head, (V, H)), ("d2t", d2t, (D,)),
                               ("t2d", t2d, (V,))):
            if tuple(t.shape) != shape:
                raise ValueError(f"verifier {name} has shape {tuple(t.shape)}, "
                                 f"the drafter config wants {shape}")
        # Both tables stay in the verifier's dtype (bf16 as extracted): an fp32 copy adds
        # no precision, and would double them and the embeddings each TTT step keeps.
        device = self.embed_tokens.weight.device
        self.embed_tokens.weight = nn.Parameter(embed_tokens.to(device), requires_grad=False)
        self.d2t.copy_(d2t)
        self.t2d.copy_(t2d)
        self.target_head = lm_head[d2t.to(lm_head.device)].to(device)

    @torch.no_grad()
    def freeze_lm_head(self) -> None:
        """Keep the draft head at the verifier's head on the draft vocabulary, untrained,
        as speculators does: each TTT step skips the head's weight gradient (one of its
        three head-sized matmuls) and the optimizer keeps no state for it. The head is
        target_head itself, in the verifier's dtype: an fp32 copy was cast back to bf16 in
        every TTT step's loss. After load_verifier."""
        self.lm_head.weight = nn.Parameter(self.target_head, requires_grad=False)

    def step_losses(self, batch: PackedBatch, ttt_steps: int, loss_chunk: int = 2048,
                    checkpoint: int = 0, positions: Positions | None = None
                    ) -> list[StepLoss]:
        """Unroll TTT over the batch and return each step's per-position losses.

        positions: scored_positions of the batch, made where it was made (the training
        step makes them on the host); None: made here.

        checkpoint: how many TTT steps, the first ones, keep only their inputs and outputs
        (hidden state, keys and values) for backward and recompute the rest of the layer
        there: one more forward of the layer per such step, for activations that no
        longer grow with the layer's own intermediates (MLP, norms, attention). The first
        ones, because backward reaches them last: by then the later steps' activations
        are freed, so each recomputed step saves its whole share of the peak.
        """
        if ttt_steps < 1:
            raise ValueError(f"ttt_steps must be at least 1, got {ttt_steps}")
        if isinstance(checkpoint, bool) or checkpoint < 0:
            raise ValueError(f"checkpoint counts TTT steps (0 or more), got {checkpoint!r}")
        ids, doc = batch.input_ids, batch.doc_ids
        layout = DocLayout(doc)
        same_docs = _same_docs(doc, ttt_steps)
        index, counts = positions or scored_positions(batch, ttt_steps)
        step_index = index.split(counts)  # per step: [P, 2] (row, column)
        aux = batch.aux_hidden
        if not torch.is_autocast_enabled(aux.device.type):
            aux = aux.to(self.fc.weight.dtype)  # stored hidden states may be bf16
        hidden = self.fc(aux)
        B, L = ids.shape
        targets = verifier_targets(batch.final_hidden.reshape(B * L, -1), self.target_head,
                                   loss_chunk)

        weights = self.midlayer.unroll_weights()
        head = self.lm_head.weight
        # a frozen head in fp8 for its input's gradient, the one matmul it takes in backward
        head_fp8 = self.head_fp8(head) if self.fp8 and not head.requires_grad else None

        def ttt_step(tokens, hidden, rotary, *earlier_kv):
            # The earlier keys and values as arguments of their own, not a list: a
            # recomputed step then saves each as a tensor, where saved-tensor hooks see it
            # (training/offload.py), rather than holding the list.
            earlier = list(zip(earlier_kv[::2], earlier_kv[1::2]))
            return self.midlayer(self.embed_tokens(tokens), hidden, rotary, layout, earlier,
                                 weights)

        # fp32 tables under autocast (the weights' dtype), fp64 for fp64 weights
        table_dtype = at_least_float32(self.fc.weight.dtype)

        earlier: list[tuple[Tensor, Tensor]] = []
        results = []
        for k in range(ttt_steps):
            s = k + 1
            tokens = torch.where(same_docs[k], _shift(ids, s, 0), 0)
            index = step_index[k]
            rows, cols = index.unbind(1)

            rotary = rotary_tables(batch.position_ids + k, self.cfg.head_dim,
                                   self.cfg.rope_theta, table_dtype)
            args = (tokens, hidden, rotary, *(t for kv in earlier for t in kv))
            if k < checkpoint and torch.is_grad_enabled():
                out = torch.utils.checkpoint.checkpoint(ttt_step, *args, use_reentrant=False)
            else:
                out = ttt_step(*args)
            hidden, key, value = out
            earlier = earlier + [(key, value)]
            # Outside the checkpoint: the loss keeps its gradients, not its inputs, so a
            # recomputation would redo its three head matmuls for nothing. The positions
            # as whole rows of the flattened batch: indexed as hidden[rows, cols], CUDA
            # gathered them element by element (docs/benchmarks.md,
            # "The loss's chunk pass in Triton, three copies gone").
            flat = rows * L + cols
            total, losses, agree = soft_cross_entropy(
                self.norm(hidden.flatten(0, 1).index_select(0, flat)), head, targets,
                flat + s, loss_chunk, head_fp8)
            results.append(StepLoss(total, losses, agree, index))
        return results

    def forward(self, batch: PackedBatch, ttt_steps: int, ttt_decay: float = PARAMS["ttt_decay"].default,
                loss_chunk: int = 2048, checkpoint: int = 0) -> DraftOutput:
        steps = self.step_losses(batch, ttt_steps, loss_chunk, checkpoint)
        loss = 0.0
        loss_ttt, acc_ttt, positions = [], [], []
        for k, step in enumerate(steps):
            n = step.losses.shape[0]
            mean = step.total / max(n, 1)
            loss = loss + ttt_decay ** k * mean
            loss_ttt.append(mean.detach())
            acc_ttt.append(step.agree.sum() / max(n, 1))
            positions.append(n)
        return DraftOutput(loss, loss_ttt, acc_ttt, positions)
