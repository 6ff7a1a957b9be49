"""The run screen draws a relaunched run's ancestors behind it, read from their real run
dirs by the app's worker: named by the params the relaunches changed, by step or by
tokens seen, and any run of the fleet picked to join them (a foreign one from its pane)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from rich.text import Text

from backends import runs
from backends.logs.series import Overlay, from_metrics
from backends.runs import RunInfo, RunPhase
from tests.tui.conftest import launch_and_wait_ended, TRAIN, screen_text, wait_for
from tests.waiting import HANG_S
from tui.app import TracksideApp, Watched
from tui.curves import Curves, Overlaid
from tui.messages import MetricsBatch, RunsListed
from scripts.sample import run_info
from tui.screens.pick_run import PickRun
from tui.state import RunState as TuiRun
from tui.widgets.loss_chart import OVERLAY_COLORS, LossChart, draw

T0 = 1_790_000_000.0
GRANDPARENT, PARENT, CHILD = "20261201-0900-0001", "20261201-0930-0002", "20261201-1000-0003"
PARAMS = {
    GRANDPARENT: {"max_seq_len": 8192, "ttt_steps": 3},
    PARENT: {"max_seq_len": 16384, "ttt_steps": 3},
    CHILD: {"max_seq_len": 16384, "ttt_steps": 5},
}
LINE = {GRANDPARENT: None, PARENT: GRANDPARENT, CHILD: PARENT}
# Loss levels far apart, so each run's curve has rows of its own; the ancestors logged
# twice the tokens per step of the child.
LEVEL = {GRANDPARENT: 6.0, PARENT: 4.0, CHILD: 2.0}
TOKENS = {GRANDPARENT: 2000, PARENT: 2000, CHILD: 1000}
FOREIGN = [sys.executable, "-c", "import time\nfor s in range(1, 41): print(f'step {s} loss={9 - s / 40:.3f}', flush=True)\ntime.sleep(60)"]


def steps(run_id: str, count: int = 100) -> list[dict]:
    return [
        {"event": "step", "time": T0 + s, "step": s, "loss": LEVEL[run_id] - s / 200, "loss_ttt": [LEVEL[run_id]],
         "tokens": TOKENS[run_id], "tokens_per_s": 1000.0}
        for s in range(1, count + 1)
    ]  # fmt: skip


def write_run(root: Path, run_id: str) -> RunInfo:
    """A run dir as trackside leaves it: manifest with params and parent, metrics.jsonl."""
    directory = root / run_id
    directory.mkdir(parents=True)
    manifest = {"run_id": run_id, "session": f"ts-{run_id}", "params": PARAMS[run_id], "parent": LINE[run_id], "run_dir": str(directory)}
    (directory / "manifest.json").write_text(json.dumps(manifest))
    (directory / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in steps(run_id)))
    return RunInfo(run_id, f"ts-{run_id}", "local", RunPhase.EXITED, 0, PARAMS[run_id], 100, 1.0, run_dir=str(directory), parent=LINE[run_id])


def chart_styles(app) -> dict:
    """The chart's drawn text per style: which curves have dots on screen."""
    drawn: Text = app.screen.query_one(LossChart).render()
    by_style: dict = {}
    for span in drawn.spans:
        by_style[span.style] = by_style.get(span.style, "") + drawn.plain[span.start : span.end]
    return by_style


def x_labels(shown: str) -> str:
    """The line of labels under the chart's x axis."""
    lines = shown.splitlines()
    return next(lines[i + 1] for i, line in enumerate(lines) if " └┬" in line)


def braille(text: str) -> int:
    return sum(0x2800 < ord(c) <= 0x28FF for c in text)


async def open_child(local_host, pilot) -> None:
    root = Path(local_host.runs_root)
    infos = [write_run(root, run_id) for run_id in (CHILD, PARENT, GRANDPARENT)]
    app = pilot.app
    app.post_message(RunsListed("local", infos, T0 + 200))
    app.post_message(MetricsBatch("local", f"local/{CHILD}", steps(CHILD, 60), garbled=0))
    await pilot.pause()
    app.open_run(f"local/{CHILD}")
    await wait_for(pilot, lambda: len(app.runs[f"local/{CHILD}"].overlays) == 2, timeout=10, what="the ancestors' curves")
    await wait_for(pilot, lambda: "grandparent" in screen_text(app), timeout=5, what="the overlays' legend")


async def test_a_relaunched_run_shows_its_ancestors_named_by_their_changes(local_host):
    app = TracksideApp([Watched(local_host)], monitor=False, clock=lambda: T0 + 200)
    async with app.run_test(size=(140, 44)) as pilot:
        await open_child(local_host, pilot)
        shown = screen_text(app)
        assert "┄┄ parent: ttt_steps 3 → 5" in shown
        assert "┄┄ grandparent: max_seq_len 8192 → 16384, ttt_steps 3 → 5" in shown
        styles = chart_styles(app)
        # Both ancestors' curves drawn in their dim colours, the child's own on top.
        assert braille(styles[OVERLAY_COLORS[0]]) > 20 and braille(styles[OVERLAY_COLORS[1]]) > 20
        # Cut to the child's 60 steps: the axis ends at its last step, not the ancestors' 100th.
        assert x_labels(shown).split() == ["1", "11", "21", "30", "40", "50", "60"]


async def test_x_toggles_between_step_and_tokens_seen(local_host):
    app = TracksideApp([Watched(local_host)], monitor=False, clock=lambda: T0 + 200)
    async with app.run_test(size=(140, 44)) as pilot:
        await open_child(local_host, pilot)
        chart = app.screen.query_one(LossChart)
        assert "loss by tokens seen" not in screen_text(app)
        await pilot.press("x")
        await wait_for(pilot, lambda: "loss by tokens seen" in screen_text(app), timeout=5, what="the tokens axis")
        assert chart.x_axis == "tokens"
        # The child saw 60,000 tokens; the ancestors, at 2,000 a step, are cut there (30 steps).
        assert x_labels(screen_text(app)).split()[-1] == "60,000"
        assert braille(chart_styles(app)[OVERLAY_COLORS[0]]) > 10
        await pilot.press("x")
        await wait_for(pilot, lambda: "loss by tokens seen" not in screen_text(app), timeout=5, what="the step axis")
        assert chart.x_axis == "step"


async def test_a_run_picked_from_the_fleet_is_drawn_behind_and_picked_again_taken_away(local_host):
    subprocess.run(["tmux", "-L", local_host.tmux_socket, "new-session", "-d", "-s", "their-sft", "--", *FOREIGN], check=True)
    app = TracksideApp([Watched(local_host)], monitor=False, clock=lambda: T0 + 200)
    async with app.run_test(size=(140, 44)) as pilot:
        await open_child(local_host, pilot)
        foreign = RunInfo(None, "their-sft", "local", RunPhase.RUNNING, pids=[1])
        app.post_message(RunsListed("local", [*(app.runs[k].info for k in list(app.runs)), foreign], T0 + 201))
        await wait_for(pilot, lambda: "local/their-sft" in app.runs, timeout=5, what="the foreign run listed")

        async def pick() -> None:
            await pilot.press("o")
            dialog = await wait_for(pilot, lambda: isinstance(app.screen, PickRun) and app.screen.is_mounted and app.screen, timeout=5, what="the picker")
            dialog.query_one("#pick-run").highlighted = dialog.keys.index("local/their-sft")
            await pilot.press("enter")

        await pick()
        run = app.runs[f"local/{CHILD}"]
        await wait_for(pilot, lambda: "local/their-sft" in run.overlays, timeout=10, what="the picked run's curve")
        await wait_for(pilot, lambda: "┄┄ their-sft" in screen_text(app), timeout=5, what="its legend")
        assert run.overlays["local/their-sft"].series.curve("loss")[:2] == [(1, 8.975), (2, 8.95)]
        assert braille(chart_styles(app)[OVERLAY_COLORS[2]]) > 10
        await pick()
        await wait_for(pilot, lambda: "local/their-sft" not in run.overlays, timeout=10, what="the picked run taken away")
        assert len(run.overlays) == 2


def test_a_relaunch_with_no_step_yet_shows_its_parent_over_the_parents_range():
    parent = from_metrics(PARENT, "local", "".join(json.dumps(e) + "\n" for e in steps(PARENT)))
    drawn = draw(None, 80, 16, False, [Overlaid(Overlay("parent: ttt_steps 3 → 5", parent), 0.3)], "tokens")
    lines = drawn.plain.splitlines()
    assert "┄┄ parent: ttt_steps 3 → 5" in lines[1]
    assert x_labels(drawn.plain).split()[0] == "2,000" and x_labels(drawn.plain).split()[-1] == "200,000"
    assert braille(drawn.plain) > 30


def test_a_relaunch_at_its_first_step_shows_its_parent_over_the_parents_range():
    """One step of its own is no range to cut the parent to: the whole parent is drawn."""
    parent = from_metrics(PARENT, "local", "".join(json.dumps(e) + "\n" for e in steps(PARENT)))
    child = TuiRun(f"local/{CHILD}", "local", run_info())
    child.add_event({"event": "step", "step": 1, "loss": 2.0, "loss_ttt": [2.0], "tokens": 1000})
    curves = Curves(0.3)
    curves.update(child)
    drawn = draw(curves, 80, 16, False, [Overlaid(Overlay("parent: ttt_steps 3 → 5", parent), 0.3)], "step")
    assert "(none in view)" not in drawn.plain
    assert x_labels(drawn.plain).split()[0] == "1" and x_labels(drawn.plain).split()[-1] == "100"
    assert braille(drawn.plain) > 30


@pytest.mark.slow
async def test_r_relaunches_a_real_run_and_its_child_shows_the_parent_behind_it(local_host):
    """End to end: a short synthetic training in tmux, edited and relaunched with `r`; the
    screen switches to the child, which draws its parent's curve named by the edit."""
    parent = await launch_and_wait_ended(local_host, [*TRAIN, "--steps", "8", "--max-seq-len", "128", "--ttt-steps", "2"])
    app = TracksideApp([Watched(local_host)], poll_interval=0.2)
    async with app.run_test(size=(140, 44)) as pilot:
        key = f"local/{parent.run_id}"
        await wait_for(pilot, lambda: key in app.runs, timeout=10, what="the parent listed")
        app.open_run(key)
        app.store.edited(key, {"ttt_steps": 3})  # as the edit form keeps it
        await pilot.press("r")
        child = await wait_for(
            pilot, lambda: next((k for k, r in app.runs.items() if r.info.parent == parent.run_id), None), timeout=30, what="the child"
        )
        await wait_for(pilot, lambda: app.screen.run_key == child, timeout=10, what="the screen on the child")
        await wait_for(pilot, lambda: "┄┄ parent: ttt_steps 2 → 3" in screen_text(app), timeout=10, what="the parent's legend")
        await wait_for(pilot, lambda: app.runs[child].start is not None, timeout=HANG_S, what="the child's start event")
        await wait_for(pilot, lambda: braille(chart_styles(app).get(OVERLAY_COLORS[0], "")) > 10, timeout=60, what="the parent's curve (drawn over the child's own range, which grows as it trains)")


async def test_the_legend_says_when_the_code_changed_between_parent_and_child(local_host):
    # A relaunch that shipped an edited training package (backends/ship/__init__.py): its parent's
    # curve is named by the code's change as well as the params'.
    root = Path(local_host.runs_root)
    code = {CHILD: "9f8e7d6c5b4a", PARENT: "1a2b3c4d5e6f", GRANDPARENT: "1a2b3c4d5e6f"}
    infos = []
    for run_id in (CHILD, PARENT, GRANDPARENT):
        info = write_run(root, run_id)
        manifest_path = root / run_id / "manifest.json"
        manifest = json.loads(manifest_path.read_text())
        manifest["code"] = {"hash": code[run_id], "describe": None}
        manifest_path.write_text(json.dumps(manifest))
        infos.append(dataclasses.replace(info, code=runs.code_of(manifest)))
    app = TracksideApp([Watched(local_host)], monitor=False, clock=lambda: T0 + 200)
    async with app.run_test(size=(140, 44)) as pilot:
        app.post_message(RunsListed("local", infos, T0 + 200))
        app.post_message(MetricsBatch("local", f"local/{CHILD}", steps(CHILD, 60), garbled=0))
        await pilot.pause()
        app.open_run(f"local/{CHILD}")
        await wait_for(pilot, lambda: "┄┄ parent: ttt_steps 3 → 5, code 1a2b3c4 → 9f8e7d6" in screen_text(app),
                       timeout=10, what="the parent's legend naming the code's change")  # fmt: skip
        assert "┄┄ grandparent: max_seq_len 8192 → 16384, ttt_steps 3 → 5, code 1a2b3c4 → 9f8e7d6" in screen_text(app)
