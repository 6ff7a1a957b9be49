"""The x axis says what it counts (issue 43): a trainer's steps, a boosting library's
rounds, or, where a console printed no step, its losses in the order printed, in the run
screen's chart and in `trackside plot --json`'s "x"."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from backends.logs.console import summarize
from backends.runs import RunInfo, RunPhase
from tests.backends.test_runs import PY, tmux_dir  # noqa: F401 (fixture)
from tui.curves import Curves
from tui.state import RunState
from tui.widgets.loss_chart import counts_of, draw

REPO = Path(__file__).resolve().parents[2]
CONSOLES = {
    "stepped": [f"step {s} loss={3 - s / 10:.2f}" for s in range(1, 6)],
    "boosted": [f"[{r}]\tvalid_0's binary_logloss: {0.6 - r / 100:.4f}\ttraining's binary_logloss: {0.5 - r / 100:.4f}" for r in range(1, 6)],
    "printed": [f"Train Epoch: 1 [{64 * i}/640 ({10 * i}%)]\tLoss: {2.3 - i / 10:.6f}" for i in range(5)],
}


@pytest.mark.parametrize(("name", "title", "label"), [("stepped", "loss (", "step └"), ("boosted", "loss by round", "round └"), ("printed", "loss by printed point", "pt └")])
def test_the_charts_title_and_axis_name_what_x_counts(name, title, label):
    """The run screen's chart of a session trackside did not launch, as its listing read it."""
    run = RunState(f"box/{name}", "box", RunInfo(None, name, "box", RunPhase.RUNNING, console=summarize(CONSOLES[name])))
    curves = Curves(0.3)
    curves.update(run)
    text = draw(curves, 80, 12, False, counts=counts_of(run)).plain
    assert title in text and label in text


def test_plot_json_says_what_each_sessions_x_counts(tmp_path, runs_root, tmux_dir):  # noqa: F811
    config = tmp_path / "config.toml"
    config.write_text(f"[hosts.box]\nruns_root = {json.dumps(runs_root)}\n")
    for name, lines in CONSOLES.items():
        printed = tmp_path / f"{name}.txt"
        printed.write_text("".join(line + "\n" for line in lines))
        subprocess.run(["tmux", "new-session", "-d", "-s", name, "sh", "-c", 'cat "$1"; exec sleep 600', "sh", str(printed)], check=True)
    done = subprocess.run([PY, "-m", "tui.cli", "plot", *CONSOLES, "--json", "--config", str(config)], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr
    said = {doc["run"]: (doc["x"], doc["points"][-1]) for doc in json.loads(done.stdout)}
    assert said == {"stepped": ("step", [5, 2.5]), "boosted": ("round", [5, 0.45]), "printed": ("point", [5, 1.9])}
