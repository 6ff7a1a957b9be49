"""The DFlash drafter inside the training loop (training/loop.py): its shape and training
knobs from the flags, building it on the verifier, one step's forward and backward, and its step fields (a loss
and accuracy per block offset, and tau)."""
from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from training.config import DFLASH_PRESETS, DFLASH_TRAINING_PRESETS, DFlashConfig
from training.contract import UsageError
from training.data import Dataset
from training.device import autocast
from training.drafters.dflash.model import (BlockPlan, DFlashDrafter, plan_blocks,
                                            position_weights)
from training.distributed import all_reduce
from training.drafters.drafter import Drafter, base_shape
from training.packing import PackedBatch
from training.params import PARAMS, anchor_room


@dataclass(frozen=True)
class DFlashTraining:
    target_layers: tuple[int, ...]  # verifier layers read as context, among the data's
    max_anchors: int  # blocks drawn per packed row
    gamma: float  # block offset k weighs exp(-(k - 1) / gamma)
    soft_kl: float  # the share of KL(verifier || drafter) in the loss, the rest CE


@dataclass
class OffsetLoss:
    """One block offset's scored positions: DFlash's unit (training/drafters/)."""
    losses: Tensor  # [P] float32
    agree: Tensor  # [P] bool


class DFlashStep(nn.Module):
    """The drafter's pass on a batch and its plan as a forward(), so DDP sees the call it
    syncs; it picks the context layers out of the data's captured ones."""

    def __init__(self, drafter: DFlashDrafter, training: DFlashTraining,
                 data_layers: list[int]):
        super().__init__()
        self.drafter = drafter
        self.training = training
        self.data_layers = len(data_layers)
        columns = [data_layers.index(layer) for layer in training.target_layers]
        self.whole = columns == list(range(len(data_layers)))  # no copy to make
        self.register_buffer("columns", torch.tensor(columns), persistent=False)

    def forward(self, batch: PackedBatch, loss_chunk: int, plan: BlockPlan):
        aux = batch.aux_hidden
        B, L, _ = aux.shape
        if not self.whole:
            aux = aux.view(B, L, self.data_layers, -1)[:, :, self.columns].flatten(2)
        t = self.training
        return self.drafter(batch, aux, t.max_anchors, t.gamma, t.soft_kl, loss_chunk,
                            plan=plan)


def _weighted_count(counts: list[float], cfg: DFlashConfig, training: DFlashTraining
                    ) -> float:
    """Σ over offsets of weight × scored positions: what the loss's sum is divided by."""
    return sum(w * n for w, n in zip(position_weights(cfg.block_size, training.gamma), counts))


def forward_backward(model: nn.Module, batch: PackedBatch, cfg: DFlashConfig,
                     training: DFlashTraining, loss_chunk: int, world: int = 1,
                     host: PackedBatch | None = None, share: tuple[int, int] = (0, 1)
                     ) -> tuple[list[OffsetLoss], list[float]]:
    """Backward through the weighted mean loss over the global batch's scored positions.
    Returns, per block offset 1..block_size - 1, its positions' losses and their count
    over all ranks. host: the batch as the loader made it, on the host (None: batch),
    where the step's anchors are drawn (plan_blocks) for this process's `share`."""
    device = batch.input_ids.device
    plan = plan_blocks(host or batch, cfg.block_size, training.max_anchors, share,
                       training.soft_kl).onto(device)
    with autocast(device):
        out = model(batch, loss_chunk, plan)
    local = out.counts
    counts = all_reduce([float(n) for n in local], world)
    norm = _weighted_count(counts, cfg, training)
    # Each rank's share of the global mean; DDP averages gradients over ranks.
    (out.total * (world / max(norm, 1e-12))).backward()
    order = out.offset.argsort(stable=True)
    losses, agree = out.losses[order].split(local), out.agree[order].split(local)
    return [OffsetLoss(loss, ok) for loss, ok in zip(losses, agree)], counts


def step_fields(loss_pos: list[float], acc_pos: list[float], counts: list[float],
                cfg: DFlashConfig, training: DFlashTraining) -> dict:
    """The step event's loss (the weighted mean the backward took), loss_pos, acc_pos and
    tau: the expected accepted length if offset k is accepted with probability acc_pos[k]
    once every offset before it was, Σ_k Π_{j<=k} acc_pos[j]."""
    weights = position_weights(cfg.block_size, training.gamma)
    loss = sum(w * n * v for w, n, v in zip(weights, counts, loss_pos)) / max(
        _weighted_count(counts, cfg, training), 1e-12)
    tau, run = 0.0, 1.0
    for acc in acc_pos:
        run *= acc
        tau += run
    return dict(loss=loss, loss_pos=loss_pos, acc_pos=acc_pos, tau=tau)


class DFlash(Drafter):
    def __init__(self, cfg: DFlashConfig, training: DFlashTraining, fp8: bool = False):
        self.cfg, self.training, self.fp8 = cfg, training, fp8
        self.share = (0, 1)  # this process's (rank, world size), set by build

    def build(self, dataset: Dataset, device: torch.device, share: tuple[int, int]
              ) -> tuple[DFlashDrafter, DFlashStep]:
        # Built and filled on the device, as the EAGLE-3 drafter is.
        with torch.device(device):
            drafter = DFlashDrafter(self.cfg, self.fp8)
        verifier = dataset.verifier()
        drafter.load_verifier(verifier["embed_tokens"], verifier["lm_head"])
        self.share = share
        step = DFlashStep(drafter, self.training, dataset.info["layers"]).to(device)
        return drafter, step

    def own_groups(self, drafter: DFlashDrafter) -> nn.ModuleList:
        """Each draft layer: each runs once a step."""
        return drafter.layers

    def forward_backward(self, step: nn.Module, batch: PackedBatch, loss_chunk: int,
                         world: int, host: PackedBatch) -> tuple[list[OffsetLoss], list[float]]:
        return forward_backward(step, batch, self.cfg, self.training, loss_chunk, world, host,
                                self.share)

    def step_fields(self, losses: list[float], accuracies: list[float], counts: list[float]
                    ) -> dict:
        return step_fields(losses, accuracies, counts, self.cfg, self.training)

    def checkpoint_extras(self) -> dict:
        return {"dflash": dataclasses.asdict(self.training)}

    def oom_params(self) -> dict:
        return {"ttt_steps": None, "block_size": self.cfg.block_size,
                "max_anchors": self.training.max_anchors}


def config_from_flags(args: argparse.Namespace, dataset: Dataset, max_seq_len: int
                      ) -> tuple[DFlashConfig, DFlashTraining]:
    """The shape and knobs `trackside train`'s flags ask for (a knob not given: the
    preset's, else the parameter table's default), fitted to the data; a flag that does
    not fit the data or the row is refused, named."""
    base, flag = base_shape(args, dataset, DFlashConfig, DFLASH_PRESETS,
                            "an EAGLE-3 shape", "DFlash")
    knobs = ({} if args.model_config is not None
             else DFLASH_TRAINING_PRESETS.get(args.preset or "tiny", {}))
    verifier_layers, data_layers = dataset.info["num_layers"], dataset.info["layers"]
    if not data_layers:
        raise UsageError("--data: its dataset.json names no captured verifier layers, which "
                         "DFlash reads as context; make it with `trackside extract`")
    target = args.target_layers or tuple(data_layers)
    outside = [layer for layer in target if not 0 <= layer < verifier_layers]
    if outside:
        raise UsageError(f"--target-layers {outside} lie outside the verifier's layers "
                         f"0..{verifier_layers - 1}")
    missing = [layer for layer in target if layer not in data_layers]
    if missing:
        raise UsageError(f"--target-layers: the data carries layers {data_layers}, not "
                         f"{missing}; capture them with `trackside extract --layers`")
    block = args.block_size or base.block_size
    if not 2 <= block <= max_seq_len:
        raise UsageError(f"--block-size {block}: a block is the anchor and at least one "
                         f"drafted token, within a row of max_seq_len {max_seq_len}")
    # A block never crosses samples: one longer than every sample (as packed, cut to
    # max_seq_len) has nowhere to go.
    longest = min(max(dataset.lengths), max_seq_len)
    if block > longest:
        raise UsageError(f"--block-size {block} exceeds the longest sample "
                         f"({longest} tokens as packed): no block would fit in one")
    room = anchor_room(max_seq_len, block)
    anchors = args.max_anchors or min(knobs.get("max_anchors", PARAMS["max_anchors"].default),
                                      room)
    if anchors > room:
        raise UsageError(f"--max-anchors {anchors}: a row of max_seq_len {max_seq_len} holds "
                         f"at most {room} blocks of {block} tokens")
    try:
        cfg = dataclasses.replace(base, vocab_size=dataset.vocab_size, block_size=block,
                                  num_target_layers=len(target),
                                  num_layers=args.num_layers or base.num_layers)
    except ValueError as exc:
        raise UsageError(f"{flag}: {exc}") from None
    training = DFlashTraining(
        target_layers=target, max_anchors=anchors,
        gamma=args.dflash_gamma or knobs.get("gamma", PARAMS["dflash_gamma"].default),
        soft_kl=knobs.get("soft_kl", PARAMS["soft_kl"].default) if args.soft_kl is None
        else args.soft_kl)
    return cfg, training
