"""The console's parsers on lines an attacker (or an unlucky trainer) writes: random,
huge and pathological text never raises, and each line costs time linear in its length,
never a backtracking regex's quadratic (one 20 KB line once froze the dashboard for 51 s;
issues 42 and 43).

Each parser meets every fragment that steers its patterns (a bar's `%|`, a loss key, an
evaluation word, a round's `[5]\\t`, a run of blanks after a separator, ...) repeated to
LONG characters, and random compositions of them; each line must be read within BUDGET_S of
CPU time, which a quadratic pattern overruns tenfold at that length (7 to 9 s) and a linear
one meets tenfold.
"""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backends.logs.boxes import Box
from backends.logs.console import ConsoleSummary
from backends.logs.eval_heading import EvalHeading
from backends.logs.libraries.composer import ComposerLog
from backends.logs.libraries.litgpt import LitgptLog
from backends.logs.libraries.sb3 import Sb3Log
from backends.logs.libraries.sklearn import SklearnLog
from backends.logs.libraries.tables import Table
from backends.logs.libraries.timm import TimmLog
from backends.logs.libraries.torchtune import TorchtuneLog
from backends.logs.libraries.ultralytics import UltralyticsLog
from backends.logs.logparse import parse_console_line, parse_metrics_line, parse_progress, phase_of, step_of
from backends.logs.rounds import parse_round

LONG = 40_000
BUDGET_S = 1.0
FRAGMENTS = [
    "%|", "|", " ", "\t", "loss", "loss=1.0", "loss ", ", ", "[", "]", "1/2", "12/", "/", "eval ", "Test ",
    "validation ", "Epoch ", "Epoch [1/3]: ", "[1/40] ", " 50%|", "━", "╺", " - ", "valid_0's binary_logloss: 0.5\t",
    "train-logloss:0.5\t", "[5]\t", "[5]", "step=1 ", "'loss': '1.2', ", ":", ": ", "=", "e", "1", "1.", ".5",
    "a", "a:", "iteration 1/ 2 ", "Avg loss", "train loss ", "lm loss value: ", "[00:01<00:02", "<", "•", "0:00:01 ",
    "_", "-", "'", '"', "loss_0=", "{", "}", "1e", "nan", "inf", "Map: ", "\u2028", "epoch ", "train_loss ", "-------  ", "  1  ", "-----", "| train/ | |", "|    loss | 48.2 |", "|",
    "Train: 0 [   5/6 (100%)]  Loss: 0.5 (0.4)  ", "Test: [   1/1]  Time: 0.1 (0.1)  Loss:   0.3 ( 0.3)", '"loss": ', "  ",
    "Epoch    GPU_mem   box_loss ", "  1/3  0G  ", "0.8073  ", "Class  Images ", "all  8 ", "Scanning ",
    "[epoch=1][batch=2/8]:", "[epoch=", "Train loss/train/total: ", "Eval metrics/eval/CrossEntropy: 1.2",
    "2|14|Loss: 2.8415", "1|", "|Loss: ",
    "Epoch 1 | iter 4 step 2 | loss train: 3.4, ", "iter 4: val loss 3.2, ", "iter ",
    "Iteration 30, loss = 0.62071366", "Iteration ", ", loss = ", "train/loss=41.6 ", "train/n_updates=10 ", "train/",
]  # fmt: skip


# Each library's reader, with the line that makes it read the next one as its own.
READERS = [
    (Box, "-----"),
    (Table, "epoch train_loss valid_loss dur"),
    (TimmLog, "Train: 0 [   0/6 ( 17%)]  Loss: 0.7 (0.7)"),
    (UltralyticsLog, "      Epoch    GPU_mem   box_loss   cls_loss   dfl_loss  Instances       Size"),
    (ComposerLog, "[epoch=1][batch=1/8]:"),
    (TorchtuneLog, None),
    (LitgptLog, "Epoch 1 | iter 4 step 2 | loss train: 3.456, val: n/a |"),
    (SklearnLog, None),
    (Sb3Log, None),
]


def _each_line_parser(text: str) -> None:
    fields = parse_console_line(text)
    if fields is not None:
        step_of(fields)
    parse_progress(text)
    phase_of(text)
    parse_metrics_line(text)
    parse_round(text)
    for reader, primed in READERS:
        state = reader()
        if primed is not None:  # a line that puts the reader in the state where `text` is parsed
            state.read(primed)
        state.read(text)
    heading = EvalHeading()
    heading.heading(text)
    heading.trained(text)


def _fold(text: str) -> None:
    said = ConsoleSummary()
    said.add_recorded(text + "\n")
    said.add([text])
    said.settle()
    said.eta_s  # noqa: B018 (what the listing asks of it)


def _timed(parse, text: str) -> float:
    """CPU seconds, which other processes on a loaded machine do not stretch as they do the clock."""
    start = time.process_time()
    parse(text)
    return time.process_time() - start


@pytest.mark.parametrize("fragment", FRAGMENTS)
@pytest.mark.parametrize("parse", [_each_line_parser, _fold], ids=["line parsers", "fold"])
def test_a_fragment_repeated_over_a_long_line_is_read_in_linear_time(parse, fragment):
    line = fragment * (LONG // len(fragment))
    assert _timed(parse, line) < BUDGET_S, f"{fragment!r} × {len(line) // len(fragment)}"
    # a line of it ended by what the patterns look for last: a loss, a bar's count, a `]`
    for tail in (" loss=1.5", " 3/4 [00:01<00:02]", "]"):
        assert _timed(parse, line + tail) < BUDGET_S, f"{fragment!r} × {len(line) // len(fragment)} + {tail!r}"


relaxed = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large], max_examples=60)


@relaxed
@given(st.lists(st.tuples(st.sampled_from(FRAGMENTS), st.integers(1, 3000)), min_size=1, max_size=6))
def test_compositions_of_fragments_are_read_in_linear_time(parts):
    line = "".join(fragment * count for fragment, count in parts)[: 2 * LONG]
    assert _timed(_each_line_parser, line) < BUDGET_S
    assert _timed(_fold, line) < 2 * BUDGET_S


@relaxed
@given(st.text(max_size=3000))
def test_any_text_is_read_without_an_exception(text):
    _each_line_parser(text)
    _fold(text)
    for line in text.splitlines():
        _each_line_parser(line)
