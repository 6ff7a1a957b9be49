"""tokens/s and the ETA hold still from one refresh to the next, on the run screen at 80×24
and in `trackside runs`, and say the window they are measured over (issue 44)."""

from __future__ import annotations

import dataclasses
import json

from backends import pace
from backends.runs import RunPhase
from tests.tui.conftest import screen_text, wait_for
from tui.app import TracksideApp, Watched
from tui.messages import MetricsBatch, RunsListed
from scripts.sample import run_info
from tui.state import format_duration, format_number

T0 = 1_790_000_000.0
TOTAL = 20_000
TOKENS = 4096
RUN_ID = "20261206-1400-beef"
KEY = f"local/{RUN_ID}"


def start_event() -> dict:
    return {"event": "start", "time": T0, "config": {"steps": TOTAL, "max_seq_len": 4096, "ttt_steps": 3, "device": "cpu"},
            "steps_per_epoch": 5000, "world_size": 1, "process_started": T0 - 5, "startup_s": {"imports_device": 4.0}}


def bursts(count: int) -> list[dict]:
    """Step events as the trainer writes them, from a run that steps in bursts: 30 steps of
    50 ms, then one of 10 s (a checkpoint, a slow batch), so the step's own tokens/s
    alternates between 81,920 and 410."""
    events, time = [], T0
    for step in range(1, count + 1):
        seconds = 10.0 if step % 31 == 0 else 0.05
        time += seconds
        events.append({
            "event": "step", "time": time, "step": step, "epoch": 0, "loss": 9.0 - step / 1000, "loss_ttt": [9.0, 9.1, 9.2],
            "acc_ttt": [0.1, 0.05, 0.02], "lr": 3e-4, "grad_norm": 1.0, "tokens": TOKENS, "tokens_per_s": TOKENS / seconds,
            "samples_per_row": 1.0, "pad_frac": 0.0, "peak_mem_gib": 0.5,
        })  # fmt: skip
    return events


def most_moved(readings: list[tuple[float, float]]) -> float:
    """The largest factor either number moved by between two readings in a row."""
    return max(max(a / b, b / a) for before, after in zip(readings, readings[1:]) for a, b in zip(before, after))


async def test_tokens_per_s_and_the_eta_hold_still_between_refreshes_and_say_their_window(local_host):
    info = dataclasses.replace(run_info(RunPhase.RUNNING), run_id=RUN_ID, host="local", session="paced", params={"steps": TOTAL},
                               last_step=None, last_loss=None, steps_per_epoch=None)  # fmt: skip
    app = TracksideApp([Watched(local_host)], monitor=False, clock=lambda: T0)
    events = bursts(1200)
    async with app.run_test(size=(80, 24)) as pilot:
        app.post_message(RunsListed("local", [info], T0))
        app.post_message(MetricsBatch("local", KEY, [start_event()], garbled=0))
        await pilot.pause()
        app.open_run(KEY)
        run = app.runs[KEY]
        readings = []
        # A refresh every 7 events, past the run's first two minutes.
        for at in range(0, len(events), 7):
            app.post_message(MetricsBatch("local", KEY, events[at : at + 7], garbled=0))
            await wait_for(pilot, lambda: run.step == events[min(at + 6, len(events) - 1)]["step"], 5, "the batch read")
            if events[at]["time"] - T0 < 120:
                continue
            tokens_per_s, eta = run.tokens_per_s, run.eta_s()
            readings.append((tokens_per_s, eta))
            if len(readings) % 20 == 1:  # the screen shows them, with their window
                shown = f"tokens/s {format_number(tokens_per_s)}  ETA {format_duration(eta)}  ({pace.WINDOW_LABEL})"
                await wait_for(pilot, lambda: shown in screen_text(app).replace("\xa0", " "), 5, f"the stats saying {shown!r}")
    assert len(readings) > 50
    # The latest 20 events' rate and the latest step's tokens/s moved 10× and 200×.
    assert most_moved(readings) < 1.25
    # A minute's steps: tokens over seconds, the 10 s pauses included.
    assert all(8_000 < tokens_per_s < 12_000 for tokens_per_s, _ in readings)


async def test_trackside_runs_reckons_them_as_the_screen_does_over_the_same_window(local_host):
    """The listing reads a live run's whole pace window from the end of its metrics.jsonl
    (here ~170 lines, more than the 64 it reads of an ended run), so `trackside runs` and
    its JSON say the screen's numbers, and name the window."""
    from backends import runs
    from tui.commands.runs import show_runs
    from tui.state import RunState

    info = await runs.launch(local_host, ["sleep", "600"], params={"steps": TOTAL}, startup_s=0)
    events = [start_event(), *bursts(1200)]
    for cut in (400, 800, 1201):
        with open(f"{info.run_dir}/metrics.jsonl", "w") as metrics:
            metrics.writelines(json.dumps(event) + "\n" for event in events[:cut])
        [listed] = [r for r in await runs.list_runs(local_host) if r.run_id == info.run_id]
        shown = RunState(f"local/{info.run_id}", "local", listed)
        for event in events[:cut]:
            shown.add_event(event)
        assert listed.state is RunPhase.RUNNING and listed.last_step == cut - 1
        assert (listed.tokens_per_s, listed.eta_s) == (shown.tokens_per_s, shown.eta_s())
        assert listed.tokens_per_s is not None and listed.eta_s is not None
    assert listed.to_json()["pace_window_s"] == pace.WINDOW_S
    assert f"TOK/S and ETA: over each run's last {pace.WINDOW_LABEL} of steps" in show_runs([listed])
