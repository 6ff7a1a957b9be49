"""The edit form says why it predicts no peak memory, whatever the run lacks: it was
"(no memory model for this run yet)" for ever on a CPU run (issue 44)."""

from __future__ import annotations

import pytest

from tests.tui.test_edit_cost import FormApp, settled
from scripts.sample import gpus, metrics_events, run_info
from tui.screens.edit import EditScreen
from tui.state import HostState, RunState

LLAMA = {"hidden_size": 4096, "num_heads": 32, "num_kv_heads": 8, "intermediate_size": 14336,
         "vocab_size": 128256, "draft_vocab_size": 32000}  # fmt: skip


def run_with(events: list[dict]) -> RunState:
    run = RunState("h200-box/r", "h200-box", run_info())
    for event in events:
        run.add_event(event)
    return run


def on(device: str | None, model: dict) -> list[dict]:
    start, *steps = metrics_events(20, model=model)
    config = {**start["config"], **({"device": device} if device else {})}
    return [{**start, "config": config}, *steps]


@pytest.mark.parametrize("events, why", [
    (on("cpu", LLAMA), "a CPU run: no GPU memory to predict"),
    ([], "no start event yet: predicted once the run has started"),
    (on("cuda", {}), "its start event does not describe a drafter the memory model knows"),
])
async def test_the_edit_form_says_why_it_predicts_no_peak(events, why):
    form = EditScreen(run_with(events), HostState("h200-box", status="ok", gpus=gpus()), {})
    async with FormApp(form).run_test(size=(80, 24)) as pilot:
        cost = await settled(pilot, form)
    assert f"peak memory      —  ({why})" in cost


async def test_a_gpu_run_described_by_its_start_event_is_predicted():
    form = EditScreen(run_with(on("cuda", LLAMA)), HostState("h200-box", status="ok", gpus=gpus()), {})
    async with FormApp(form).run_test(size=(80, 24)) as pilot:
        cost = await settled(pilot, form)
    assert "GiB of" in cost and "—  (" not in cost
