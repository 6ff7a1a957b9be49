"""A DFlash run's chart and stats, from recorded step events: loss per block position (the
first, a middle and the last, beside the total) and τ, the expected accepted length."""

from __future__ import annotations

from rich.text import Text

from tui.curves import Curves, positions_shown
from scripts.sample import (
    DFLASH_KEY,
    dflash_events,
    dflash_info,
    gpus,
    metrics_events,
    run_info,
)
from tui.screens.fleet import run_cells
from tui.screens.run import stats_text
from tui.state import HostState, RunState
from tui.widgets.loss_chart import STEP_COLORS, TAU, TOTAL, draw


def dflash_run(steps: int = 60, events: list[dict] | None = None) -> RunState:
    run = RunState(DFLASH_KEY, "h200-box", dflash_info())
    for event in events or dflash_events(steps):
        run.add_event(event)
    return run


def drawn(run: RunState, width: int = 120, height: int = 20) -> Text:
    curves = Curves(0.3)
    curves.update(run)
    return draw(curves, width, height, False)


def dots_by_style(text: Text) -> dict:
    counts: dict = {}
    for span in text.spans:
        counts[span.style] = counts.get(span.style, 0) + sum(0x2800 < ord(c) <= 0x28FF for c in text.plain[span.start : span.end])
    return counts


def test_a_block_shows_its_first_middle_and_last_position():
    assert positions_shown(15) == (0, 7, 14)
    assert positions_shown(2) == (0, 1)
    assert positions_shown(1) == (0,)
    assert positions_shown(0) == ()


def test_a_dflash_run_draws_a_curve_per_shown_position_and_its_tau():
    run = dflash_run()
    text = drawn(run)
    legend = text.plain.splitlines()[0]
    assert "━━ total  ━━ pos 1  ━━ pos 8  ━━ pos 15" in legend
    assert "ttt" not in legend
    dots = dots_by_style(text)
    assert dots[TOTAL] > 30
    assert all(dots[STEP_COLORS[k]] > 30 for k in range(3))  # each position's curve on screen
    # τ: the latest logged, as the stats show it, and its course rising as the drafter learns
    assert any(s.style == TAU and text.plain[s.start : s.end] == "τ " for s in text.spans)
    _, latest, course = legend[legend.index("τ ") :].split()[:3]
    assert latest == f"{run.tau:.3g}"
    assert len(course) == 16 and course[0] == "▁" and course[-1] == "█"


def test_the_curves_start_over_when_the_block_size_changes():
    run = dflash_run(20)
    curves = Curves(0.3)
    curves.update(run)
    assert curves.labels == ["total", "pos 1", "pos 8", "pos 15"]
    # relaunched into the same run dir with block 8: another start, then 7 positions a step
    resumed = [{"event": "start", "config": {"resumed_from_step": 20}},
               *({**e, "step": e["step"] + 20, "loss_pos": e["loss_pos"][:7], "acc_pos": e["acc_pos"][:7]} for e in dflash_events(5)[1:])]  # fmt: skip
    for event in resumed:
        run.add_event(event)
    curves.update(run)
    assert curves.labels == ["total", "pos 1", "pos 4", "pos 7"]
    assert len(curves.steps) == 25 and len(curves.tau) == 25


def test_an_eagle3_run_keeps_its_ttt_steps_and_shows_no_tau():
    run = RunState("h200-box/r", "h200-box", run_info())
    for event in metrics_events(40):
        run.add_event(event)
    text = drawn(run)
    assert "━━ total  ━━ ttt 0  ━━ ttt 1  ━━ ttt 2" in text.plain.splitlines()[0]
    assert "τ" not in text.plain
    assert not run.is_dflash and run.tau is None


def test_dflash_steps_without_tau_draw_their_positions_alone():
    events = [{k: v for k, v in e.items() if k != "tau"} for e in dflash_events(30)]
    text = drawn(dflash_run(events=events))
    assert "━━ pos 15" in text.plain and "τ" not in text.plain


def test_the_stats_and_the_fleet_show_tau_and_the_dflash_knobs():
    run = dflash_run()
    assert run.is_dflash
    assert {k: run.params[k] for k in ("block_size", "max_anchors", "dflash_gamma", "soft_kl")} == {
        "block_size": 16, "max_anchors": 1024, "dflash_gamma": 7.0, "soft_kl": 0.15}  # fmt: skip
    stats = stats_text(run, 0.0).plain
    assert "block_size 16  max_anchors 1024  soft_kl 0.15" in stats
    assert "ttt_steps" not in stats
    tau = run.last["tau"]
    assert f"τ {tau:.3g}   acc pos 1/8/15: " in stats
    cells = run_cells(run, HostState("h200-box", status="ok", gpus=gpus()))
    assert cells["ttt"] == f"τ{tau:.2g}"
