"""Smoothing and the edit form's predictions, on plain state."""

from __future__ import annotations

import gc

import pytest
from rich.color import ColorSystem
from rich.style import Style
from textual.strip import Strip

from tui.curves import Curves
from tui.escape_cache import ESCAPE_CACHE, bound_escape_cache
from tui.predict import Basis
from scripts.sample import NOW, PARAMS, metrics_events, run_info
from tui.screens.run import stats_text
from tui.state import STEP_HISTORY, RunState


def make_run(events: list[dict]) -> RunState:
    run = RunState("h200-box/r", "h200-box", run_info())
    for event in events:
        run.add_event(event)
    return run


def step(n: int, loss, ttt=None) -> dict:
    return {"event": "step", "step": n, "loss": loss, "loss_ttt": ttt}


def test_step_history_is_not_walked_by_the_garbage_collector():
    run = make_run(metrics_events(20))
    gc.collect()
    assert run.last["loss_ttt"] == pytest.approx(metrics_events(20)[-1]["loss_ttt"])
    assert not any(gc.is_tracked(event) for event in run.steps)


def test_escape_cache_stays_small_and_renders_the_same():
    bound_escape_cache()
    render_ansi = Strip.render_ansi.__func__
    # One style per screen offset, as Textual makes them for text selection.
    for y in range(3 * ESCAPE_CACHE):
        style = Style(bold=True, color="red", meta={"offset": (0, y)})
        assert Strip.render_ansi(style, ColorSystem.TRUECOLOR) == render_ansi.__wrapped__(Strip, style, ColorSystem.TRUECOLOR)
    assert render_ansi.cache_info().currsize <= ESCAPE_CACHE


def test_curves_smooth_and_skip_gaps_and_garbage():
    run = make_run([step(1, 1.0, [2.0]), step(2, float("nan"), "x"), step(3, 3.0, [4.0, 5.0])])
    curves = Curves(0.5)
    curves.update(run)
    assert curves.labels == ["total", "ttt 0", "ttt 1"]
    assert [list(s) for s in curves.smooth] == [[1.0, 1.0, 2.0], [2.0, 2.0, 3.0], [None, None, 5.0]]
    curves.resmooth(1.0)
    assert list(curves.smooth[0]) == [1.0, 1.0, 3.0]


def test_curves_fold_in_new_steps_as_a_full_pass_would():
    run = make_run([])
    followed = Curves(0.1)
    for n in range(STEP_HISTORY + 300):  # past the history's bound: the oldest steps drop out
        run.add_event(step(n, 2.0 + (n % 7) / 7, [n % 3, 1.0]))
        if n % 97 == 0:
            followed.update(run)
    followed.update(run)
    assert list(followed.steps) == list(range(300, STEP_HISTORY + 300))
    rebuilt = Curves(0.1)
    rebuilt.update(run)
    for kept, full in zip(followed.smooth, rebuilt.smooth):
        assert list(kept)[-1000:] == pytest.approx(list(full)[-1000:])  # the window's start differs, then agrees

    run.reset_streams()  # the files are read again from their start
    run.add_event(step(0, 9.0))
    followed.update(run)
    assert list(followed.steps) == [0] and list(followed.smooth[0]) == [9.0]


def test_a_resumed_run_replaces_the_steps_it_redoes():
    run = make_run([{"event": "start", "config": {"resumed_from_step": 0}}])
    curves = Curves(0.1)
    for n in range(1, 11):
        run.add_event(step(n, 5.0 - n / 10))
    run.add_event({"event": "end", "status": "error"})
    curves.update(run)
    # it stopped after step 10; its last checkpoint was at step 6
    run.add_event({"event": "start", "config": {"resumed_from_step": 6}})
    assert run.end is None
    for n in range(7, 9):
        run.add_event(step(n, 1.0))
    assert [e["step"] for e in run.steps] == [1, 2, 3, 4, 5, 6, 7, 8]
    curves.update(run)
    assert list(curves.steps) == [1, 2, 3, 4, 5, 6, 7, 8]
    assert list(curves.raw[0])[-3:] == pytest.approx([4.4, 1.0, 1.0])


def test_prediction_scales_steps_with_row_length_and_time_with_ttt():
    run = make_run(metrics_events(50))
    now = Basis.of(run).predict({})
    assert now.steps_per_epoch == 4120
    doubled = Basis.of(run).predict({"max_seq_len": 2 * PARAMS["max_seq_len"]})
    assert doubled.steps_per_epoch == 2060
    deeper = Basis.of(run).predict({"ttt_steps": 5})
    assert deeper.epoch_s == pytest.approx(now.epoch_s * 5 / 3)
    assert now.peak_gib is None and now.largest_max_seq_len is None  # no drafter shape: "—"


def test_prediction_of_peak_memory_grows_with_row_length():
    from training.config import PRESETS

    run = make_run(metrics_events(50, model=PRESETS["llama3-8b"].to_dict()))
    now = Basis.of(run).predict({}).peak_gib
    assert now == pytest.approx(40.2, rel=0.1)  # calibrated on the run's measured peak
    assert Basis.of(run).predict({"max_seq_len": 16384}).peak_gib > now
    assert Basis.of(run).predict({"ttt_steps": 5}).peak_gib > now
    largest = Basis.of(run).predict({}, gpu_mem_gib=140.4).largest_max_seq_len
    assert largest > 8192 and largest % 1024 == 0
    assert Basis.of(run).predict({"ttt_steps": 5}, gpu_mem_gib=140.4).largest_max_seq_len < largest
    # a step too long to fit is told how many TTT steps to recompute
    longer = {"max_seq_len": 98304, "ttt_steps": 5}
    n = Basis.of(run).predict(longer, gpu_mem_gib=140.4).fewest_checkpoint_ttt
    assert 0 < n < 5
    assert Basis.of(run).predict({**longer, "checkpoint_ttt": n}, gpu_mem_gib=140.4).largest_max_seq_len >= 98304
    assert Basis.of(run).predict({**longer, "checkpoint_ttt": n - 1}, gpu_mem_gib=140.4).largest_max_seq_len < 98304
    # a run launched while the flag was a bool recorded `true`: every step
    assert Basis.of(run).predict({**longer, "checkpoint_ttt": True}).peak_gib == \
        Basis.of(run).predict({**longer, "checkpoint_ttt": 5}).peak_gib


def test_pane_captures_yield_each_new_line_once():
    from tui.monitor import new_lines

    assert new_lines([], ["a", "b"]) == ["a", "b"]
    assert new_lines(["a", "b", "c"], ["b", "c", "d", "e"]) == ["d", "e"]  # scrolled by one
    assert new_lines(["a", "b"], ["a", "b"]) == []
    assert new_lines(["a", "b"], ["x", "y"]) == ["x", "y"]  # scrolled past everything seen


@pytest.mark.parametrize("status, code, shown", [
    ("stopped", 1, "(stopped) launcher exit 1"),  # torchrun after a clean stop
    ("completed", 0, "(completed) exit 0"),
    ("failed", 1, "(failed) exit 1"),
    (None, -9, "exit -9"),  # killed before it could write its end
])
def test_the_launchers_exit_code_after_the_trainers_own_end(status, code, shown):
    run = make_run(metrics_events(3) + ([{"event": "end", "status": status}] if status else []))
    run.info.exit_status = code
    first_line = stats_text(run, NOW).plain.splitlines()[1]
    assert first_line.endswith(shown), first_line
