"""Log parsing: metrics events, loss from other trainers' console lines, progress bars."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backends.logs.logparse import Progress, parse_console_line, parse_metrics_line, parse_progress, phase_of, step_of
from backends.logs.screen import visible_text
from backends.untrusted_json import LARGEST_INT

relaxed = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize(
    "line, expected",
    [
        ("step=12 loss=1.23 lr=3e-4", {"step": 12, "loss": 1.23, "lr": 3e-4}),
        (
            "{'loss': 1.2, 'grad_norm': 0.3, 'learning_rate': 1e-05, 'epoch': 0.5}",
            {"loss": 1.2, "grad_norm": 0.3, "learning_rate": 1e-05, "epoch": 0.5},
        ),
        ('{"loss": 0.75, "epoch": 2}', {"loss": 0.75, "epoch": 2}),
        ("loss: 1.23", {"loss": 1.23}),
        ("loss 1.23", {"loss": 1.23}),
        ("Loss=1.2e-1", {"loss": 0.12}),
        ("  5%|▌ | 50/1000 [00:10<03:10, 4.98it/s, loss=2.31, lr=1e-4]", {"loss": 2.31, "lr": 1e-4}),
        ("2026-11-29 09:00:01 INFO step 5 | loss 2.5 | lr 1e-4", {"step": 5, "loss": 2.5, "lr": 1e-4}),
        ("\x1b[32mINFO\x1b[0m loss=\x1b[1m0.5\x1b[0m", {"loss": 0.5}),
        ("train/loss=0.5 eval/loss=0.7", {"train/loss": 0.5, "eval/loss": 0.7, "loss": 0.5, "eval_loss": 0.7}),
        ("epoch 1/3 step=7 loss=-0.25", {"step": 7, "loss": -0.25}),
        # tqdm redraws in place: the newest value is after the last carriage return
        ("1%| | 1/99 [00:01<01:30, loss=9.9]\r2%| | 2/99 [00:02<01:29, loss=8.8]", {"loss": 8.8}),
        # nanoGPT: a colon ends the iteration's field; `12.3ms` and `3.21%` are not numbers
        ("iter 100: loss 2.3456, time 12.3ms, mfu 3.21%", {"iter": 100, "loss": 2.3456}),
        # nanoGPT's evaluation: both losses are its estimates, neither a training step's
        ("step 250: train loss 1.9123, val loss 2.0123", {"step": 250, "train_loss": 1.9123, "val_loss": 2.0123, "eval_loss": 2.0123}),
        # torchtitan's validation, Megatron's, transformers 5's quoted values
        ("validate step: 300  loss:  3.5005", {"step": 300, "eval_loss": 3.5005}),
        ("validation loss at iteration 100 | lm loss value: 2.3 | lm loss PPL: 10.0 |", {"iteration": 100, "lm_loss": 2.3, "ppl": 10.0, "eval_loss": 2.3}),
        ("{'loss': '4.575', 'grad_norm': '1.039', 'epoch': '0.1562'}", {"loss": 4.575, "grad_norm": 1.039, "epoch": 0.1562}),
        # a tqdm postfix cut at the terminal's width: its last value is not read
        ("Epoch 1:  3%| | 1/32 [00:00<00:00, 9it/s, v_num=0, train_loss=0.424, val_loss=0.27", {"epoch": 1, "v_num": 0, "train_loss": 0.424, "loss": 0.424}),
        # torchtitan, coloured
        ("\x1b[31mstep:  10  \x1b[32mloss:  7.1234  \x1b[33mmemory: 12.34GiB(15.6%)", {"step": 10, "loss": 7.1234}),
        # speculators: one loss per TTT step, the first standing for the run
        (
            "train/loss_0=2.345, train/full_acc_0=0.123, train/loss_1=2.678, epoch=0, lr=1.00e-04",
            {"train/loss_0": 2.345, "train/full_acc_0": 0.123, "train/loss_1": 2.678, "epoch": 0, "lr": 1e-4, "loss": 2.345},
        ),
        ('{"step": 3, "loss": 1.2}', {"step": 3, "loss": 1.2}),
        ("12:30:45 loss: 5", {"loss": 5}),
    ],
)
def test_console_formats(line, expected):
    assert parse_console_line(line) == expected


@pytest.mark.parametrize(
    "line, step",
    [
        ("step=12 loss=1.23", 12),
        ("iter 100: loss 2.3", 100),
        ('{"global_step": 7, "loss": 1.0}', 7),
        ("train/step=5 train/loss=1.0", 5),
        ("{'loss': 1.2, 'epoch': 0.5}", None),  # HF Trainer: an epoch is never a step
        ("{'loss': 1.2, 'epoch': 3}", None),
        ("step=1.5 loss=1", None),
        ("step=-3 loss=1", None),
        ("Epoch 1 | iter 400 step 200 | loss 2.5 | iter time: 120.00 ms (step)", 200),  # litgpt's shape: iterations, optimizer steps
    ],
)
def test_step_of(line, step):
    assert step_of(parse_console_line(line)) == step


def test_numbers_past_any_int_are_read_as_floats():
    # Longer integers than 18 digits are floats, however long (int() refuses over 4,300)
    assert parse_console_line("step=" + "9" * 2000 + " loss=" + "1" * 2000) == {"step": math.inf, "loss": math.inf}
    # A line past screen.LINE_CAP is cut: the number its cut shortened is not read
    assert parse_console_line("step=" + "9" * 5000 + " loss=" + "1" * 5000) is None
    assert step_of({"step": math.inf}) is None
    assert parse_progress("Shards: " + "9" * 5000 + "/" + "9" * 5000) is None
    assert parse_progress(" 5%|▌ | 50/1000 [" + "1" * 5000 + "<00:02]") == Progress("working", 50, 1000, None, "")


def test_console_nan_loss_is_kept():
    fields = parse_console_line("step=40 loss=nan grad_norm=inf")
    assert math.isnan(fields["loss"]) and fields["grad_norm"] == math.inf and fields["step"] == 40


@pytest.mark.parametrize(
    "line",
    [
        "",
        "Loading checkpoint shards:  50%|█████     | 32/64 [01:02<01:02,  1.95s/it]",
        "GPU 0 at 690 W, batch 4",
        "lr=3e-4 step=12",  # no loss: not a metrics line
        "loss went down a lot",
        "loss=4.98it/s",
        "Traceback (most recent call last):",
    ],
)
def test_console_lines_without_loss(line):
    assert parse_console_line(line) is None


@pytest.mark.parametrize(
    "line, evaluated",
    [
        ("Test set: Average loss: 0.0010, Accuracy: 209/360 (58%)", 0.001),  # an evaluation: its average is its loss
        ("Training Results - Epoch: 1  Avg accuracy: 0.50 Avg loss: 1.90", None),  # ignite's epoch average: no step's
        ("Test: [ 9/9]  Time: 0.1  Loss:  0.6914 (0.7012)", 0.6914),  # timm's test phase
    ],
)
def test_an_average_over_a_set_is_never_a_training_steps_loss(line, evaluated):
    fields = parse_console_line(line)
    assert "loss" not in fields and fields.get("eval_loss") == evaluated


@pytest.mark.parametrize(
    "line, expected",
    [
        ("Loading safetensors checkpoint shards: 12/64", Progress("loading", 12, 64, None, "Loading safetensors checkpoint shards", "counter")),
        (
            "Loading checkpoint shards:  50%|█████     | 32/64 [01:02<01:02,  1.95s/it]",
            Progress("loading", 32, 64, 62.0, "Loading checkpoint shards"),
        ),
        (
            "  5%|▌         | 50/1000 [00:10<03:10, 4.98it/s, loss=2.31, lr=1e-4]",
            Progress("training", 50, 1000, 190.0, ""),
        ),
        ("Extracting hidden states:   0%|          | 0/1000 [00:00<?, ?it/s]", Progress("extracting", 0, 1000, None, "Extracting hidden states")),
        ("Epoch 2:  10%|█         | 100/1000 [1:02:03<9:18:27, 37.2s/it]", Progress("training", 100, 1000, 33507.0, "Epoch 2", "tqdm", 2)),
        ("Compiling kernels: 3/10", Progress("compiling", 3, 10, None, "Compiling kernels", "counter")),
        ("100%|██████████| 8/8 [00:03<00:00,  2.40it/s]", Progress("working", 8, 8, 0.0, "")),
        ("Step 120/5000 | loss 2.31", Progress("training", 120, 5000, None, "Step", "counter")),
        ("iter 7/10: loss 1.0", Progress("training", 7, 10, None, "iter", "counter")),
        # Megatron-LM pads its counts
        (" iteration       10/     100 | consumed samples: 80 | lm loss: 1.05E+01 |", Progress("training", 10, 100, None, "iteration", "counter")),
        # Lightning's Rich bar (epochs from 0, to max_epochs - 1) and Keras 3's
        ("Epoch 1/2  ━━━━━━━━━╺━━━━━━━ 17/32 0:00:00 • 0:00:01 39.85it/s v_num: 0.000", Progress("training", 17, 32, 1.0, "Epoch 1/2", "rich", 1, 2)),
        ("17/32 ━━━━━━━━━━━━━━━━━━━━ 1s 76ms/step - loss: 1.2430", Progress("training", 17, 32, None, "", "keras")),
        # Keras' verbose=2 line at an epoch's end, ignite's ProgressBar (its epochs from 1)
        ("24/24 - 0s - 2ms/step - loss: 10.3195 - val_loss: 2.2239", Progress("training", 24, 24, None, "", "keras")),
        ("Epoch [2/3]: [20/40]  50%|██████████████              , loss=2.06 [00:00<00:01]", Progress("training", 20, 40, 1.0, "Epoch [2/3]", "ignite", 2, 3, 1)),
    ],
)
def test_progress_formats(line, expected):
    assert parse_progress(line) == expected


# `Accuracy: 209/360` counts right answers (the mnist example's test line): no job's progress (issue 43)
@pytest.mark.parametrize("line", ["", "step=12 loss=1.2", "ratio 3/4 of the way", "Shards: 65/64", "Shards: 1/0", "12:30:45", "Test set: Average loss: 2.2475, Accuracy: 209/360 (58%)"])
def test_not_progress(line):
    assert parse_progress(line) is None


@pytest.mark.parametrize(
    "line, phase",
    [
        ("Loading checkpoint shards: 3/64", "loading"),
        ("capturing layers 2, 30, 58", "extracting"),
        ("torch._inductor compiling graph", "compiling"),
        ("step=3 loss=1.0", "training"),
        ("hello", None),
    ],
)
def test_phase_of(line, phase):
    assert phase_of(line) == phase


def test_metrics_events():
    step = {"event": "step", "time": 1.5, "step": 3, "loss": 2.25, "loss_ttt": [2.0, 2.5], "lr": 1e-4}
    assert parse_metrics_line(json.dumps(step) + "\n") == step
    for bad in ["", "{", "[1, 2]", '{"loss": 1}', '{"event": 3}', "null", "[" * 100_000, "step=1 loss=2"]:
        assert parse_metrics_line(bad) is None


# ---------------------------------------------------------------------------------------
# Properties

KEYS = st.from_regex(r"[a-z][a-z0-9_]{0,10}", fullmatch=True)
VALUES = st.floats(allow_nan=False, width=64) | st.integers(-10**9, 10**9)
LOGISH = st.lists(
    st.sampled_from(list("loss=:{}',[]|%/<>. \t\r\x1b0123456789eE+-naif") + ["\x1b[32m", "it/s", "█", "lr", "step", "iter", "9" * 400]),
    max_size=80,
).map("".join) | st.text(max_size=200)


@relaxed
@given(LOGISH)
def test_never_raises(line):
    result = parse_console_line(line)
    assert result is None or all(isinstance(v, (int, float)) for v in result.values())
    step = step_of(result or {})
    assert step is None or (isinstance(step, int) and step >= 0)
    progress = parse_progress(line)
    assert progress is None or 0 <= progress.done <= progress.total
    phase_of(line)
    visible_text(line)
    parse_metrics_line(line)


@relaxed
@given(st.dictionaries(KEYS, VALUES, max_size=6), VALUES, st.sampled_from(["kv", "colon", "dict", "tqdm"]))
def test_console_round_trip(extra, loss, style):
    fields = {"loss": loss, **{k: v for k, v in extra.items() if not k.endswith("loss")}}
    if style == "kv":
        line = " ".join(f"{k}={v!r}" for k, v in fields.items())
    elif style == "colon":
        line = " | ".join(f"{k}: {v!r}" for k, v in fields.items())
    elif style == "dict":
        line = repr(fields)
    else:
        line = "  5%|▌ | 50/1000 [00:10<03:10, 4.98it/s, " + ", ".join(f"{k}={v!r}" for k, v in fields.items()) + "]"
    parsed = parse_console_line(line)
    assert parsed == fields
    assert all(type(parsed[k]) is type(v) for k, v in fields.items())


@relaxed
@given(st.integers(0, 10**6), st.integers(0, 10**6), st.none() | st.integers(0, 10**5), st.sampled_from(["Loading checkpoint shards", "Extracting", "", "Epoch 3"]))
def test_tqdm_round_trip(done, extra, eta, desc):
    total = done + extra
    if total == 0:
        return
    clock = "?" if eta is None else (f"{eta // 3600}:{eta // 60 % 60:02d}:{eta % 60:02d}" if eta >= 3600 else f"{eta // 60:02d}:{eta % 60:02d}")
    pct = 100 * done // total
    bar = "█" * (pct // 10) + " " * (10 - pct // 10)
    line = f"{desc}{': ' if desc else ''}{pct:3d}%|{bar}| {done}/{total} [00:01<{clock}, 1.00it/s]"
    progress = parse_progress(line)
    assert (progress.done, progress.total, progress.eta_s, progress.label) == (done, total, None if eta is None else float(eta), desc)


@relaxed
@given(st.dictionaries(st.text(max_size=8), st.recursive(st.none() | st.booleans() | st.integers(-LARGEST_INT, LARGEST_INT) | st.text(max_size=5), lambda c: st.lists(c, max_size=3), max_leaves=5), max_size=5), st.text(min_size=1, max_size=10))
def test_metrics_round_trip(payload, event):
    line = json.dumps({**payload, "event": event})
    assert parse_metrics_line(line) == {**payload, "event": event}


def test_metrics_numbers_no_view_can_reckon_with_read_as_absent():
    line = '{"event": "step", "step": 99999999999999999999999, "time": Infinity, "loss": NaN, "lr": -Infinity, "tokens": 1e400, "x": [NaN, 2]}'
    assert parse_metrics_line(line) == {"event": "step", "step": None, "time": None, "loss": None, "lr": None, "tokens": None, "x": [None, 2]}
