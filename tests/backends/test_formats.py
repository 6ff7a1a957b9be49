"""Other people's trainers, read from what they really printed.

Each fixture in tests/fixtures/consoles/ is a real run of a real library (its name and
version in the fixture's JSON; how each was made in capture/README-*.md): `.raw`, the bytes
its tmux pane received, recorded by `tmux pipe-pane` as trackside records a pane; `.pane.txt`,
the pane's scrollback as `capture-pane` gives it; `.json`, the truth, from the library's
own records (log history, callbacks), never from its console.

The rule is the dashboard's: read right or not at all. Every point read must be the
library's loss at that step (to the digits the console shows), every evaluation loss an
evaluation's, never a training one; the final step must be the run's. Where a console does
not say which step a loss is (a bar drawn less often than its postfix changes, a postfix
cut at the terminal's width), fewer points are read: MINIMUM holds how many are read today,
so reading less is a regression.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backends.logs.console import ConsoleSummary, summarize

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "consoles"
NAMES = sorted(p.stem for p in FIXTURES.glob("*.json"))

# fixture: (training points, evaluation points) read at least from its recorded bytes
MINIMUM = {
    # the bar's count lags its postfix: the first new loss at each count only; the last
    # evaluation is printed after the last bar, and trainers date that one differently
    "accelerate-tqdm-postfix": (36, 1),
    "deepspeed-engine-cpu": (40, 0),
    "deepspeed-pipe-cpu": (20, 0),  # every other step printed
    "jsonl-mlp": (60, 3),
    "keras-3.15.1": (91, 3),  # Keras skips redraws closer than 50 ms: those steps are never shown
    "lightning-2.6.6-rich": (91, 2),
    "lightning-2.6.6-rich-wide": (91, 3),
    "lightning-2.6.6-tqdm": (95, 0),  # at 80 columns its postfix cuts val_loss short: never read
    "lightning-2.6.6-tqdm-wide": (95, 3),
    "megatron-gpt-source": (50, 5),
    "nanogpt-char-cpu": (101, 6),
    "specforge-eagle3-offline-cpu": (32, 4),
    "speculators-eagle3-cpu": (44, 1),  # its last evaluation is dated at the step after the run's last
    "torchtitan-source": (30, 4),
    "transformers-4.57-trainer": (14, 3),
    "transformers-5-trainer": (14, 4),
    "transformers-5-trainer-epochs": (19, 5),
    # issue 43: the trainers people run, captured in capture/README-issue43.md
    "transformers-5.25-datasets-bar": (30, 8),  # datasets' Map bars (2000/2000) before the Trainer's own
    "transformers-5.25-datasets-notqdm": (30, 0),  # disable_tqdm: dicts and Map bars only, no step anywhere
    "torch-2.13-mnist-example": (12, 0),  # `[640/2560 (25%)]` counts samples; `Accuracy: 64/360` is no step
    "torch-2.13-quickstart": (12, 0),  # `Test Error:` heads the evaluation's `Avg loss`
    "fabric-2.6-mnist-example": (12, 0),
    "lightgbm-4.7-valid": (0, 8),  # valid_0, its only set, is a validation set: no training loss
    "lightgbm-4.7-train-valid": (8, 8),
    "xgboost-3.2-sklearn": (0, 0),  # validation_0 is the training set here: the console cannot say which
    "xgboost-3.2-train": (9, 9),
    "sklearn-1.9-mlp": (30, 0),
    "sklearn-1.9-mlp-early-stopping": (30, 0),  # `Validation score` is an accuracy
    "keras-3.15-verbose2": (5, 5),
    "trl-1.16-sft": (20, 5),  # five dataset-preparation bars per set, one saying `train dataset`, before the Trainer's
    "skorch-1.4-printlog": (8, 8),  # a table, a row an epoch
    "sb3-2.9-ppo": (5, 0),  # a box a rollout, its loss at its `train/n_updates` (update epochs, not optimizer steps)
    "sentence-transformers-6.3-fit": (12, 3),  # the HF Trainer's console, a `Loading weights: 23/23` bar first
    "ignite-0.5-progressbar": (83, 0),  # its postfix leads its count; its evaluations' steps are not said
    "composer-0.32-progress-bar": (0, 0),  # its bars cut at 80 columns by Composer, the loss postfix never printed
    "composer-0.32-console": (13, 3),  # ConsoleLogger's `[epoch=1][batch=2/8]:` heading (on its bar's row) and metric lines
    "litgpt-0.5-pretrain": (20, 4),  # `iter 4 step 2` under accumulation 2; `iter 10: val loss` dated at step 5
    "torchtune-0.6-full-finetune": (20, 0),  # its bar's description `2|14|Loss: 2.84` names the step, the bar counts the epoch's
    "fastai-2.8-fit-one-cycle": (4, 4),  # its table, a row an epoch from 0, under fastprogress' bars
    "ultralytics-8.4-yolo": (0, 0),  # three losses and no total, cut at 80 columns: its epoch only (not `Scanning … 32/32`)
    "timm-1.0-train-script": (3, 3),  # an epoch's means at its last update and test batch (summary.csv's)
}


def truth(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def shown_as(read: float, true: float) -> bool:
    """Whether `read` is `true` as a console prints it: tqdm's 3 significant digits (and
    Lightning's padding of them), Keras' 4 decimals, nanoGPT's 4."""
    return abs(read - true) <= max(5.1e-4, abs(true) * 6e-3)


def assert_read_right(points, true_points, counted: bool = False) -> None:
    """Every point read is the library's at that step; counted points (no step printed
    anywhere) are its losses in order."""
    if counted:
        values = iter(v for _, v in true_points)
        for _, read in points:
            assert any(shown_as(read, v) for v in values), f"{read} is not one of the losses, in order"
        return
    true: dict[int, list[float]] = {}
    for step, value in true_points:  # Megatron evaluates twice at its last step
        true.setdefault(step, []).append(value)
    wrong = [(step, read, true.get(step)) for step, read in points if not any(shown_as(read, v) for v in true.get(step, []))]
    assert not wrong, f"(step, read, true): {wrong[:5]}"


def test_every_fixture_names_its_library_and_version_and_is_a_real_run():
    assert set(NAMES) == set(MINIMUM), "a fixture without its minimum, or a minimum without its fixture"
    for name in NAMES:
        doc = truth(name)
        assert doc["library"] and doc["version"] and (doc["train"] or doc["eval"]), name
        assert (FIXTURES / f"{name}.raw").stat().st_size > 0


@pytest.mark.parametrize("name", NAMES)
def test_recorded_output_is_read_right(name):
    doc = truth(name)
    said = ConsoleSummary()
    said.add_recorded((FIXTURES / f"{name}.raw").read_bytes().decode(errors="replace"))
    said.settle()
    assert_read_right(said.curve, doc["train"], said.counted)
    assert_read_right(said.eval_curve, doc["eval"])
    train, evals = MINIMUM[name]
    assert len(said.curve) >= train and len(said.eval_curve) >= evals
    assert said.step in (None, doc["last_step"]) if said.counted else said.step == doc["last_step"]
    assert said.total_steps in (None, doc["total_steps"])
    assert said.loss is None or shown_as(said.loss, doc["train"][-1][1]) or said.counted
    last_evals = [v for step, v in doc["eval"] if step == doc["eval"][-1][0]]  # Megatron evaluates twice at its last
    assert said.eval_loss is None or any(shown_as(said.eval_loss, v) for v in last_evals)


@pytest.mark.parametrize("name", [n for n in NAMES if (FIXTURES / f"{n}.pane.txt").exists()])
def test_a_panes_scrollback_is_read_right_or_not_at_all(name):
    """What `capture-pane` kept: bars in their last state only, so less is known."""
    doc = truth(name)
    said = summarize((FIXTURES / f"{name}.pane.txt").read_text().split("\n"))
    assert_read_right(said.curve, doc["train"], said.counted)
    assert_read_right(said.eval_curve, doc["eval"])
    assert said.step in (None, doc["last_step"])


def test_sklearns_iterations_are_epochs_and_another_loops_are_steps():
    """scikit-learn's `Iteration N, loss = X` (eight decimals) counts passes over the data;
    the same words from another loop, a loss as it happened to print it, count steps."""
    for line, axis in (("Iteration 30, loss = 0.62071366", "epoch"), ("Iteration 30, loss = 0.6207", "step")):
        said = summarize([line])
        assert (said.axis, said.step, said.loss) == (axis, 30, float(line.rsplit(" ", 1)[1]))


def test_a_bar_a_librarys_reader_reads_is_the_runs_progress():
    """torchtune's bar, whose description its reader reads, is its loop's: the progress is
    its count, not the bare `0/10` drawn before its first step named one."""
    said = summarize(["  0%|          | 0/10 [00:00<?, ?it/s]", "2|14|Loss: 2.8415: 40%|████      | 4/10 [00:00<00:00, 64.82it/s]"])
    assert (said.step, said.loss) == (14, 2.8415)
    assert (said.progress.done, said.progress.total, said.progress.phase) == (4, 10, "training")
