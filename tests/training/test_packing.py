import random

import pytest
import torch

from training.packing import collate, plan_rows


def test_plan_places_every_sample_once_and_is_deterministic():
    rng = random.Random(0)
    lengths = [rng.randint(1, 300) for _ in range(200)] + [700, 513]
    plan = plan_rows(lengths, 512)
    assert plan == plan_rows(list(lengths), 512)
    assert sorted(i for row in plan for i in row) == list(range(len(lengths)))
    for row in plan:
        assert sum(min(lengths[i], 512) for i in row) <= 512
    # Best-fit decreasing wastes little on these sizes: within 3 % of the lower bound.
    lower_bound = -(-sum(min(n, 512) for n in lengths) // 512)
    assert len(plan) <= lower_bound * 1.03


def test_plan_best_fit_and_overlong_samples():
    # 20 is cut to a whole row; 3 goes to the row with the least room that fits it.
    assert plan_rows([5, 20, 3], 10) == [[1], [0, 2]]
    assert plan_rows([6, 7, 3, 4], 10) == [[1, 2], [0, 3]]
    with pytest.raises(ValueError, match="empty"):
        plan_rows([3, 0], 10)


def test_collate_builds_rows_of_exactly_max_seq_len(make_sample):
    samples = [make_sample(n, seed=i) for i, n in enumerate((5, 5, 12, 3))]
    batch = collate([[samples[0], samples[1]], [samples[2]], [samples[3]]], 10)
    assert batch.input_ids.shape == (3, 10)
    assert batch.aux_hidden.shape == (3, 10, 192)
    assert batch.doc_ids[0].tolist() == [0] * 5 + [1] * 5
    assert batch.position_ids[0].tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4]
    assert batch.doc_ids[2].tolist() == [0, 0, 0] + [-1] * 7
    assert not batch.loss_mask[2, 3:].any()
    assert torch.equal(batch.input_ids[1], samples[2]["input_ids"][:10])
    assert torch.equal(batch.final_hidden[0, 5:], samples[1]["final_hidden"][:5])
    assert (batch.num_samples, batch.num_truncated) == (4, 1)
    assert batch.pad_tokens == 7
    assert batch.samples_per_row == pytest.approx(4 / 3)
    assert batch.pad_frac == pytest.approx(7 / 30)


def test_collate_rejects_an_overfull_row(make_sample):
    with pytest.raises(ValueError, match="more than max_seq_len"):
        collate([[make_sample(6, 0), make_sample(6, 1)]], 10)
