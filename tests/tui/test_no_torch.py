"""The dashboard as an operator's laptop installs it — `pip install .`, no extras, no torch —
opens, edits a run and relaunches it, and never imports torch.

scripts/test_no_extras.sh runs this file in such a venv. The trainer it watches runs with
the Python that has torch, named by TRACKSIDE_TRAINER_PYTHON (the repository's venv).
"""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

from backends import runs
from tests.tui.conftest import wait_for
from tui.app import TracksideApp, Watched
from tui.predict import Basis
from scripts.sample import metrics_events, run_info
from tui.screens.edit import EditScreen
from tui.state import RunState, RunStatus

TRAINER_PYTHON = os.environ.get("TRACKSIDE_TRAINER_PYTHON")
pytestmark = pytest.mark.skipif(
    not TRAINER_PYTHON, reason="run by scripts/test_no_extras.sh, in a venv without torch"
)


def test_the_installed_dashboard_has_no_torch_beside_it():
    import tui

    assert "site-packages" in tui.__file__  # not the checkout the tests were copied from
    assert importlib.util.find_spec("torch") is None


@pytest.mark.parametrize("command", ["train", "extract"])
def test_the_trainers_commands_say_in_one_line_what_is_missing(command):
    import subprocess

    done = subprocess.run([sys.executable, "-m", "tui.cli", command, "--synthetic"], capture_output=True, text=True)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [done.stderr.strip()] and "pip install 'trackside[train]'" in done.stderr


def test_the_memory_model_predicts_without_torch():
    from training.config import PRESETS

    run = RunState("h200-box/r", "h200-box", run_info())
    for event in metrics_events(5, model=PRESETS["llama3-8b"].to_dict()):
        run.add_event(event)
    cost = Basis.of(run).predict({"max_seq_len": 16384}, gpu_mem_gib=140.4)
    assert cost.peak_gib > 40 and cost.largest_max_seq_len > 16384
    assert "torch" not in sys.modules


async def test_open_edit_relaunch(local_host):
    argv = [TRAINER_PYTHON, "-m", "training", "train", "--synthetic"]
    first_info = await runs.launch(
        local_host, argv, session="no-torch", params={"max_seq_len": 256, "ttt_steps": 2, "steps": 3}
    )
    app = TracksideApp([Watched(local_host, smi="nvidia-smi-absent")])
    async with app.run_test(size=(160, 48)) as pilot:
        key = f"local/{first_info.run_id}"
        first = await wait_for(pilot, lambda: app.runs.get(key), 30, "the run in the fleet")
        # Ended first, so that `r` relaunches it without asking about a live original.
        await wait_for(pilot, lambda: first.status is RunStatus.FINISHED, 90, "the run to finish")
        # Its steps are read only while it is followed (running, or open on a run screen):
        # a run this short may have ended before the first listing saw it.
        assert first.params["max_seq_len"] == 256

        await pilot.press("e")
        form = await wait_for(pilot, lambda: isinstance(app.screen, EditScreen) and app.screen.is_mounted and app.screen, 10, "the edit form")
        await pilot.press("ctrl+a", "ctrl+k", "5", "1", "2")  # max_seq_len has the focus
        await wait_for(pilot, lambda: form.changes == {"max_seq_len": 512} and form.cost_is_current, 10, "the cost")
        assert "steps per epoch" in form.query_one("#edit-cost").render().plain
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: app.pending.get(key) == {"max_seq_len": 512}, 10, "the edit to be kept")

        await pilot.press("r")
        second = await wait_for(
            pilot,
            lambda: next((r for r in app.runs.values() if r.info.parent == first.info.run_id), None),
            30,
            "the relaunched run",
        )
        assert second.params["max_seq_len"] == 512
        await wait_for(pilot, lambda: second.start is not None, 90, "the relaunched run's start event")
        assert second.start["config"]["max_seq_len"] == 512
    assert "torch" not in sys.modules
