"""A run's series: step records read from metrics.jsonl text or a console, and the curves
`trackside plot` and the run screen's overlays draw from them."""

from __future__ import annotations

import json

import pytest

from backends.logs import series


def jsonl(*events: dict) -> str:
    return "".join(json.dumps(e) + "\n" for e in events)


def step(n: int, loss: float, **more) -> dict:
    return {"event": "step", "time": 100.0 + 2 * n, "step": n, "loss": loss, "tokens": 1000, **more}


def test_tokens_are_a_running_sum_and_time_counts_from_the_start():
    text = jsonl({"event": "start", "time": 100.0, "config": {}}, step(1, 3.0), step(2, 2.5, tokens=500), step(3, 2.0))
    run = series.from_metrics("r", "box", text)
    assert run.curve("loss", "tokens") == [(1000.0, 3.0), (1500.0, 2.5), (2500.0, 2.0)]
    assert run.curve("loss", "time") == [(2.0, 3.0), (4.0, 2.5), (6.0, 2.0)]
    assert run.curve("loss") == [(1.0, 3.0), (2.0, 2.5), (3.0, 2.0)]


def test_a_resumed_run_drops_the_steps_it_redid_and_garbage_is_skipped():
    text = jsonl(
        {"event": "start", "time": 100.0, "config": {}}, step(1, 3.0), step(2, 2.9), step(3, 2.8),
        {"event": "start", "time": 200.0, "config": {"resumed_from_step": 2}}, step(3, 2.7), step(4, 2.6),
    ) + "{not json\n[1, 2]\n"  # fmt: skip
    assert series.from_metrics("r", "box", text).curve("loss") == [(1, 3.0), (2, 2.9), (3, 2.7), (4, 2.6)]


def test_acc_is_the_first_drafted_tokens_accuracy_for_eagle_and_dflash():
    eagle = series.from_metrics("e", "box", jsonl(step(1, 3.0, acc_ttt=[0.5, 0.3])))
    dflash = series.from_metrics("d", "box", jsonl(step(1, 3.0, acc_pos=[0.6, 0.2], tau=1.8)))
    assert eagle.curve("acc") == [(1.0, 0.5)] and dflash.curve("acc") == [(1.0, 0.6)]
    assert dflash.curve("tau") == [(1.0, 1.8)]


def test_the_charts_curves_by_their_legend_names():
    """`pos K` and `ttt K`, as the run screen's legend names its curves: `trackside plot`
    could not draw a block position's loss, which the screen draws."""
    dflash = series.from_metrics("d", "box", jsonl(step(1, 3.0, loss_pos=[1.5, 2.5, 4.0]), step(2, 2.0, loss_pos=[1.0, 2.0, 3.0])))
    eagle = series.from_metrics("e", "box", jsonl(step(1, 3.0, loss_ttt=[2.0, 2.6])))
    assert dflash.curve("pos 1") == [(1.0, 1.5), (2.0, 1.0)] and dflash.curve("pos3") == [(1.0, 4.0), (2.0, 3.0)]
    assert eagle.curve("ttt 0") == [(1.0, 2.0)] and eagle.curve("ttt 1") == [(1.0, 2.6)]
    assert [series.part_name("pos", 0), series.part_name("ttt", 0)] == ["pos 1", "ttt 0"]
    for missing, run in (("pos 0", dflash), ("pos 4", dflash), ("ttt 2", eagle), ("ttt 0", dflash)):
        with pytest.raises(series.SeriesError, match=f"never logged {missing}"):
            run.curve(missing)


def test_a_metric_never_logged_names_the_run_and_what_it_did_log():
    run = series.from_metrics("20261201-1100-aaaa", "box", jsonl(step(1, 3.0, lr=0.1)))
    with pytest.raises(series.SeriesError) as missing:
        run.curve("acc")
    assert "20261201-1100-aaaa on box never logged acc" in str(missing.value)
    assert "loss, tokens, lr" in str(missing.value)
    with pytest.raises(series.SeriesError, match="choose one of step, tokens, time"):
        run.curve("loss", "epoch")


def test_a_console_plots_its_loss_against_steps_and_has_no_tokens():
    run = series.from_console("hf-sft", "box", "\n".join(f"step {s} loss={3.0 - s / 10}" for s in range(1, 4)))
    assert run.curve("loss") == [(1.0, 2.9), (2.0, 2.8), (3.0, 2.7)]
    with pytest.raises(series.SeriesError, match="never logged loss against tokens"):
        run.curve("loss", "tokens")


def test_changed_params_read_as_the_tweak():
    assert series.changed({"ttt_steps": 3, "lr": 3e-4}, {"ttt_steps": 5, "lr": 3e-4}) == "ttt_steps 3 → 5"
    assert series.changed({"max_seq_len": 8192}, {"max_seq_len": 16384, "ttt_steps": 5}) == (
        "max_seq_len 8192 → 16384, ttt_steps unset → 5"
    )
    assert series.changed({"lr": 1e-4}, {"lr": 1e-4}) == "same params"
