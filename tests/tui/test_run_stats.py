"""The run screen's stats at 80×24 say what the run's own events and log say: the epoch as
the trainer numbers it, and a start-up that names CUDA only where there was CUDA (issue 44)."""

from __future__ import annotations

import dataclasses

import pytest

from backends.runs import RunPhase
from tests.tui.conftest import screen_text, wait_for
from tui.app import TracksideApp, Watched
from tui.messages import ConsoleBatch, MetricsBatch, RunsListed
from scripts.sample import run_info
from tui.screens.run import RunScreen

T0 = 1_790_000_000.0
RUN_ID = "20261206-1400-e90c"
KEY = f"local/{RUN_ID}"
PER_EPOCH = 104


def start_event(device: str) -> dict:
    return {"event": "start", "time": T0, "config": {"steps": 20_000, "max_seq_len": 2048, "ttt_steps": 3, "device": device},
            "steps_per_epoch": PER_EPOCH, "world_size": 1, "process_started": T0 - 20.0,
            "startup_s": {"imports_device": 15.2, "data": 0.1, "model": 0.3, "resume": 0.0}}  # fmt: skip


def step_event(step: int, epoch: int) -> dict:
    return {"event": "step", "time": T0 + step, "step": step, "epoch": epoch, "loss": 2.5, "loss_ttt": [2.5, 2.6, 2.7],
            "acc_ttt": [0.5, 0.4, 0.3], "lr": 3e-4, "grad_norm": 0.9, "tokens": 2048, "tokens_per_s": 2048.0,
            "samples_per_row": 1.0, "pad_frac": 0.0, "peak_mem_gib": 1.5}  # fmt: skip


def trainer_line(event: dict) -> str:
    """The line the trainer prints with each step event (training/loop.py)."""
    return (f"step={event['step']} epoch={event['epoch']} loss={event['loss']:.4f} acc_0=0.500 lr={event['lr']:.3e} "
            f"grad_norm={event['grad_norm']:.3f} tokens_per_s={event['tokens_per_s']:.0f} peak_mem_gib={event['peak_mem_gib']:.2f}")


async def open_run(local_host, pilot, events: list[dict]) -> RunScreen:
    app = pilot.app
    info = dataclasses.replace(run_info(RunPhase.RUNNING), run_id=RUN_ID, host="local", session="stats",
                               last_step=None, last_loss=None, steps_per_epoch=None)  # fmt: skip
    app.post_message(RunsListed("local", [info], T0))
    app.post_message(MetricsBatch("local", KEY, events, garbled=0))
    app.post_message(ConsoleBatch("local", KEY, [trainer_line(e) for e in events if e["event"] == "step"]))
    await pilot.pause()
    app.open_run(KEY)
    return await wait_for(pilot, lambda: isinstance(app.screen, RunScreen) and app.screen.is_mounted and app.screen, 10, "the run screen")


async def test_the_stats_number_the_epoch_as_the_log_under_them_does(local_host):
    """The trainer's epoch counts from 0 (its step event's `epoch`, its log's `epoch=`); the
    stats counted from 1 and said `epoch 14` over a log saying `epoch=13`."""
    step = 13 * PER_EPOCH + 48
    events = [start_event("cpu"), *(step_event(s, (s - 1) // PER_EPOCH) for s in range(step - 3, step + 1))]
    app = TracksideApp([Watched(local_host)], monitor=False, clock=lambda: T0 + step)
    async with app.run_test(size=(80, 24)) as pilot:
        await open_run(local_host, pilot, events)
        await wait_for(pilot, lambda: f"step={step} epoch=13" in screen_text(app), 10, "the trainer's line in the log")
        await wait_for(pilot, lambda: f"step {step} (epoch 13, 48/{PER_EPOCH})" in screen_text(app), 10, "the stats' step")
        assert "epoch 14" not in screen_text(app)


@pytest.mark.parametrize("device, said", [("cpu", "imports 15.2"), ("cuda", "imports and CUDA 15.2")])
async def test_the_start_up_names_cuda_only_on_a_gpu_run(local_host, device, said):
    events = [start_event(device), step_event(1, 0)]
    app = TracksideApp([Watched(local_host)], monitor=False, clock=lambda: T0 + 2)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await open_run(local_host, pilot, events)
        await wait_for(pilot, lambda: "first step" in screen_text(app), 10, "the start-up line")
        shown = screen.stats_shown.plain  # what the stats show, before they wrap at 80 columns
        assert f"{said}, data 0.1, model 0.3" in shown
        assert device == "cuda" or "CUDA" not in shown
