"""The real transformers Trainer in someone's tmux pane at 80×24, watched by the dashboard
with no run screen open: every step it logged is on the curve afterwards, at the step the
Trainer printed, and `trackside plot --json` says the same."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from backends.hosts import LocalHost
from tests.backends.test_runs import tmux_dir  # noqa: F401 (fixture)
from tests.tui.conftest import wait_for
from tui.app import TracksideApp, Watched

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

STEPS = 200
# A tiny Llama, random tokens, a step logged every step; its own log history written at
# the end is the truth.
TRAINER = r"""
import json, os, sys, torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

torch.manual_seed(0)
config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                     num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32)
rows = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 64, (64, 16)).tolist()]
args = TrainingArguments(output_dir=sys.argv[1], max_steps=int(sys.argv[2]), logging_steps=1,
                         per_device_train_batch_size=4, learning_rate=3e-3, report_to="none",
                         save_strategy="no", use_cpu=True, dataloader_pin_memory=False)
trainer = Trainer(model=LlamaForCausalLM(config), args=args, train_dataset=rows)
trainer.train()
history = [[e["step"], e["loss"]] for e in trainer.state.log_history if "loss" in e]
with open(sys.argv[3] + ".tmp", "w") as f:  # whole when the test sees it
    json.dump(history, f)
os.replace(sys.argv[3] + ".tmp", sys.argv[3])
"""


@pytest.mark.slow
async def test_every_step_a_real_hf_trainer_logged_is_on_the_curve_and_in_plot(tmux_dir, runs_root, tmp_path):  # noqa: F811
    script, truth_file = tmp_path / "train.py", tmp_path / "history.json"
    script.write_text(TRAINER)
    host = LocalHost(runs_root=runs_root)
    app = TracksideApp([Watched(host, smi="nvidia-smi-absent")], poll_interval=0.5)
    async with app.run_test(size=(80, 24)) as pilot:
        # The dashboard is up before the trainer starts: its listing records the pane from its start.
        await pilot.pause(1.0)
        # As a user runs it: from a shell that stays when the trainer ends.
        subprocess.run(
            ["tmux", "new-session", "-d", "-s", "hf", "-x", "80", "-y", "24", "sh", "-c", '"$@"; exec sleep 600', "sh",
             sys.executable, str(script), str(tmp_path / "out"), str(STEPS), str(truth_file)],
            check=True,
        )  # fmt: skip
        run = await wait_for(pilot, lambda: app.runs.get("local/hf"), 30, "the trainer's session in the fleet")
        started = time.monotonic()
        await wait_for(pilot, lambda: truth_file.exists(), 240, "the Trainer to finish its 200 steps")
        truth = dict(json.loads(truth_file.read_text()))
        assert len(truth) == STEPS
        await wait_for(pilot, lambda: run.step == STEPS, 15, "the listing to read the last step")
        assert app.screen.__class__.__name__ == "FleetScreen"  # its run screen was never opened
        curve = list(run.console_loss)
        assert len(curve) >= 0.95 * STEPS, f"{len(curve)} points of {STEPS} in {time.monotonic() - started:.0f}s"
        # Each at a step the Trainer logged, with the loss it logged there (to the digits printed).
        assert all(step in truth and abs(loss - truth[step]) <= max(5.1e-4, 6e-3 * abs(truth[step])) for step, loss in curve)

    config = tmp_path / "config.toml"
    config.write_text(f"[hosts.box]\nruns_root = {json.dumps(runs_root)}\n")
    plotted = subprocess.run(
        [sys.executable, "-m", "tui.cli", "plot", "hf", "--json", "--config", str(config)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert plotted.returncode == 0, plotted.stderr
    points = json.loads(plotted.stdout)[0]["points"]
    assert len(points) >= 0.95 * STEPS
    assert all(int(step) in truth and abs(loss - truth[int(step)]) <= max(5.1e-4, 6e-3 * abs(truth[int(step)])) for step, loss in points)
