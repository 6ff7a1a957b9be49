"""Both drafters answer the one interface the training loop asks of them
(training/drafters/): built on the verifier, a step's forward and backward, the step
event's fields, what a checkpoint and an `oom` event add."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from training.config import DFLASH_PRESETS, PRESETS
from training.data import Dataset, Loader, Position
from training.drafters.dflash.step import DFlashTraining
from training.loop import TrainConfig, drafter_of
from training.metrics import MetricsWriter
from training.synthetic import synthetic_dataset


def config(name: str, data: Path, dataset: Dataset) -> TrainConfig:
    if name == "eagle3":
        return TrainConfig(data=data, run_dir=data, drafter=PRESETS["tiny"], ttt_steps=2)
    layers = tuple(dataset.info["layers"])
    drafter = dataclasses.replace(DFLASH_PRESETS["tiny"], vocab_size=dataset.vocab_size,
                                  num_target_layers=len(layers), block_size=4)
    return TrainConfig(data=data, run_dir=data, drafter=drafter,
                       dflash=DFlashTraining(layers, max_anchors=8, gamma=7.0, soft_kl=0.0))


# What is particular to each: the step event's own fields, the units a step scores
# positions in (TTT steps, block offsets), the oom event's params, the checkpoint's extras.
EXPECTED = {
    "eagle3": ({"loss", "loss_ttt", "acc_ttt"}, 2, {"ttt_steps": 2}, {}),
    "dflash": ({"loss", "loss_pos", "acc_pos", "tau"}, 3,
               {"ttt_steps": None, "block_size": 4, "max_anchors": 8},
               {"dflash": {"target_layers": (2, 4, 5), "max_anchors": 8, "gamma": 7.0,
                           "soft_kl": 0.0}}),
}


@pytest.mark.parametrize("name", EXPECTED)
def test_a_step_of_either_drafter_through_the_interface(name):
    data = synthetic_dataset(0)
    dataset = Dataset(data)
    fields, units, oom, extras = EXPECTED[name]
    drafting = drafter_of(config(name, data, dataset))
    torch.manual_seed(0)
    drafter, step = drafting.build(dataset, torch.device("cpu"), (0, 1))
    batches = Loader(dataset, 256, 1, seed=0).iterate(Position())
    batch = next(batches)[0]
    batches.close()
    scored, counts = drafting.forward_backward(step, batch, 2048, 1, batch)
    assert len(scored) == len(counts) == units
    assert counts == [float(s.losses.shape[0]) for s in scored] and all(counts)
    trained = [p for p in drafter.parameters() if p.requires_grad]
    assert trained and all(p.grad is not None for p in trained)
    losses = [float(s.losses.mean()) for s in scored]
    step_fields = drafting.step_fields(losses, [float(s.agree.float().mean()) for s in scored],
                                       counts)
    assert set(step_fields) == fields
    # the metrics writer holds the event to the contract (training/metrics.py)
    MetricsWriter(None).write("step", step=1, epoch=0, **step_fields, lr=1e-4, grad_norm=1.0,
                              tokens=10, tokens_per_s=1.0, samples_per_row=1.0,
                              pad_frac=0.0, peak_mem_gib=1.0)
    assert drafting.oom_params() == oom
    assert drafting.checkpoint_extras() == extras

