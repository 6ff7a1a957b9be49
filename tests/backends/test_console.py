"""Folding console lines into a summary: last loss and step, progress, the loss curve."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backends.logs.console import CURVE_POINTS, ConsoleSummary, summarize
from backends.logs.logparse import Progress

relaxed = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


def hf_dict(i: int) -> str:
    return f"{{'loss': {3 - i / 100:.4f}, 'grad_norm': 0.51, 'learning_rate': 1e-05, 'epoch': {i / 100:.2f}}}"


HF_BAR = " 20%|██        | 2000/10000 [10:00<40:00,  3.33it/s]"


def test_hf_trainer_losses_are_spread_up_to_the_bar_that_counts_them():
    said = summarize([hf_dict(i) for i in range(1, 201)] + [HF_BAR])
    assert said.step == 2000 and said.loss == 1.0
    assert said.progress == Progress("training", 2000, 10000, 2400.0, "")
    # logged every 10 steps: 200 losses by step 2000
    assert list(said.curve)[:2] == [(10, 2.99), (20, 2.98)] and said.curve[-1] == (2000, 1.0)


def test_hf_trainer_without_a_bar_keeps_its_losses_in_order_and_names_no_step():
    said = summarize([hf_dict(i) for i in range(1, 201)])
    assert [s for s, _ in said.curve] == list(range(1, 201)) and said.counted
    assert said.step is None and said.loss == 1.0  # a count of lines is no step


def test_hf_evaluation_and_summary_dicts_are_not_steps():
    lines = [
        HF_BAR,
        hf_dict(1),
        "{'eval_loss': 0.9, 'eval_runtime': 5.1, 'eval_samples_per_second': 99.0, 'epoch': 1.0}",
        " 40%|████      | 20/50 [00:02<00:03,  9.10it/s]",  # the evaluation's own bar
        "{'train_runtime': 100.1, 'train_samples_per_second': 9.9, 'train_loss': 1.5, 'epoch': 3.0}",
    ]
    said = summarize(lines)
    assert said.curve[-1] == (2000, 2.99) and len(said.curve) == 1
    assert said.step == 2000 and said.loss == 2.99
    assert said.progress.total == 50  # what the pane shows now: the evaluation


def test_new_losses_follow_the_bar_across_batches():
    """The dashboard folds a pane's scrollback, then each capture's new lines."""
    said = ConsoleSummary()
    said.add([hf_dict(i) for i in range(1, 201)] + [HF_BAR])
    said.add([" 20%|██        | 2005/10000 [10:02<40:00,  3.33it/s]"])
    said.add([hf_dict(201), " 20%|██        | 2010/10000 [10:03<40:00,  3.33it/s]"])
    assert said.curve[-1] == (2010, 0.99) and said.step == 2010 and len(said.curve) == 201


def test_lightning_draws_one_bar_per_epoch():
    lines = [
        "Epoch 0: 100%|██████████| 1000/1000 [00:30<00:00, 15.00it/s, v_num=0, train_loss=2.310]",
        "Validation DataLoader 0: 100%|██████████| 50/50 [00:01<00:00, 45.00it/s]",
        "Epoch 1: 100%|██████████| 1000/1000 [00:30<00:00, 15.00it/s, v_num=0, train_loss=2.000]",
        "Epoch 2:  45%|████▌     | 450/1000 [00:30<00:36, 15.00it/s, v_num=0, train_loss=1.900]",
    ]
    said = summarize(lines)
    assert list(said.curve) == [(1000, 2.31), (2000, 2.0), (2450, 1.9)]
    assert said.step == 2450 and said.progress == Progress("training", 450, 1000, 36.0, "Epoch 2", "tqdm", 2)


def test_a_bar_that_starts_again_is_the_next_epochs():
    lines = [f"{p}%|█| {n}/100 [00:01<00:01, 9it/s, loss={l}]" for p, n, l in [(50, 50, 2.0), (100, 100, 1.5), (20, 20, 1.2)]]
    assert list(summarize(lines).curve) == [(50, 2.0), (100, 1.5), (120, 1.2)]


@pytest.mark.parametrize(
    "lines, step, loss",
    [
        ([f"iter {i}: loss {3 - i / 1000:.4f}, time 12.3ms, mfu 3.21%" for i in range(0, 2000, 10)], 1990, 1.01),
        ([f"step: {i}  loss: {7 - i / 100:7.4f}  memory: 12.34GiB(15.6%)  tps: 1,234" for i in range(1, 101)], 100, 6.0),
        ([f'{{"step": {i}, "loss": {1 / i}}}' for i in range(1, 51)], 50, 0.02),
    ],
)
def test_formats_that_name_their_step(lines, step, loss):
    said = summarize(lines)
    assert (said.step, said.loss) == (step, pytest.approx(loss))
    assert len(said.curve) == len(lines) and said.curve[-1] == (step, said.loss)


def test_losses_with_no_step_anywhere_are_counted_and_name_no_step():
    """speculators' lines name no step: its curve counts them, and no step is shown."""
    said = summarize([f"train/loss_0={2 - i / 100:.3f}, train/full_acc_0=0.5, epoch=0, lr=1.00e-04" for i in range(30)])
    assert said.step is None and said.counted and said.loss == pytest.approx(1.71)
    assert [s for s, _ in said.curve] == list(range(1, 31))


def test_a_named_step_wins_over_bars():
    said = summarize([" 50%|█████     | 1/2 [00:01<00:01, 1.0it/s]", "step=40 loss=1.0", " 99%|█████████▉| 99/100 [00:01<00:00]"])
    assert said.step == 40 and list(said.curve) == [(40, 1.0)] and said.progress.done == 99


def test_loading_bars_are_progress_not_steps():
    said = summarize(["Loading checkpoint shards:  50%|█████     | 32/64 [01:02<01:02,  1.95s/it]"])
    assert said.step is None and said.progress.phase == "loading" and said.loss is None


def test_a_data_pass_bar_before_training_is_no_step_and_the_bar_under_way_at_the_first_loss_is():
    """datasets' Map bar (done, labelled) and TRL's labelled preparation bars count rows; the
    Trainer's bare bar, under way when its first dict is printed, counts steps (issue 43)."""
    said = summarize([
        "Map: 100%|██████████| 2000/2000 [00:00<00:00, 28383.04 examples/s]",
        "Tokenizing train dataset: 100%|█████| 900/900 [00:00<00:00, 1995.56 examples/s]",
        "  3%|▎         | 5/150 [00:00<00:05, 26.1it/s]",
        hf_dict(1),
        "  7%|▋         | 10/150 [00:00<00:05, 26.1it/s]",
    ])
    assert (said.step, said.total_steps, said.curve[-1]) == (10, 150, (10, 2.99))


def test_counts_that_are_not_steps_are_neither_steps_nor_progress():
    said = summarize(["Train Epoch: 1 [640/2560 (25%)]\tLoss: 2.302714", "Test set: Average loss: 2.2475, Accuracy: 209/360 (58%)"])
    assert (said.step, said.progress, said.loss, said.eval_loss, said.axis) == (None, None, 2.302714, 2.2475, "point")


def test_the_curve_is_bounded():
    said = summarize(f"step={i} loss=1.0" for i in range(CURVE_POINTS + 10))
    assert len(said.curve) == CURVE_POINTS and said.curve[-1] == (CURVE_POINTS + 9, 1.0)


def test_nan_losses_are_reported_as_they_are():
    said = summarize(["step=1 loss=2.0", "step=2 loss=nan"])
    assert math.isnan(said.loss) and said.step == 2


LINES = st.lists(
    st.text(max_size=120)
    | st.sampled_from([hf_dict(3), HF_BAR, "iter 5: loss 1.0", "Epoch 1:  10%|█| 10/100 [00:01<00:09, loss=2]", "step=9 loss=nan"])
    | st.builds(lambda n, m, l: f"{n}%|█| {n}/{m} [00:01<00:01, loss={l}]", st.integers(0, 10**20), st.integers(0, 10**20), st.floats()),
    max_size=40,
)


@relaxed
@given(st.lists(LINES, max_size=4))
def test_no_lines_break_the_fold(batches):
    said = ConsoleSummary()
    for batch in batches:
        said.add(batch)
    assert said.step is None or (isinstance(said.step, int) and said.step >= 0)
    assert all(isinstance(s, int) and s >= 0 and isinstance(l, (int, float)) for s, l in said.curve)
    assert said.loss is None or isinstance(said.loss, (int, float))


def test_a_line_naming_an_earlier_step_in_passing_does_not_start_the_run_again():
    said = summarize([f"step={s} loss={3 - s / 1000}" for s in range(1, 1001)] + ["new best loss 2.6 at step 400, saving"])
    assert said.step == 1000 and len(said.curve) == 1000 and said.curve[-1] == (1000, 2.0)
    resumed = summarize([f"step={s} loss=1.0" for s in range(1, 11)] + [f"step={s} loss=0.5" for s in range(6, 9)])
    assert [s for s, _ in resumed.curve] == [1, 2, 3, 4, 5, 6, 7, 8] and resumed.step == 8  # a resume, logged alike


def test_the_runs_loss_is_named_not_the_first_of_several():
    said = summarize(["step=10 aux_loss=0.012 lm_loss=2.345", "step=11 aux_loss=0.011 moe_loss=2.0"])
    assert list(said.curve) == [(10, 2.345)] and said.loss == 2.345  # the second names no run's loss: none read
