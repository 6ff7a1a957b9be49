"""The edit form's cost: predicted in a worker thread once typing pauses, newest answer shown."""

from __future__ import annotations

import threading
import time

import pytest

from textual.app import App
from textual.widgets import Input, Static

from scripts.sample import gpus, metrics_events, run_info
from tui.screens import edit
from tui.screens.edit import EditScreen
from tui.state import HostState, RunState

LLAMA = {"hidden_size": 4096, "num_heads": 32, "num_kv_heads": 8, "intermediate_size": 14336,
         "vocab_size": 128256, "draft_vocab_size": 32000}  # fmt: skip


class FormApp(App):
    def __init__(self, form: EditScreen) -> None:
        super().__init__()
        self.form = form

    def on_mount(self) -> None:
        self.push_screen(self.form)


def a_form() -> EditScreen:
    run = RunState("h200-box/r", "h200-box", run_info())
    for event in metrics_events(20, model=LLAMA):
        run.add_event(event)
    return EditScreen(run, HostState("h200-box", status="ok", gpus=gpus()), {})


async def settled(pilot, form: EditScreen, timeout: float = 10.0) -> str:
    await pilot.pause()  # the edit's own messages first: they ask for its cost
    deadline = time.monotonic() + timeout
    while not form.cost_is_current:
        assert time.monotonic() < deadline, "the cost never caught up with the edit"
        await pilot.pause(0.05)
    return form.query_one("#edit-cost", Static).render().plain


def recording(monkeypatch, slow_for: int | None = None) -> tuple[list[tuple[dict, str]], list[dict]]:
    """cost_text, recording each call's changes and thread as it starts and its changes as
    it ends; slow for one max_seq_len."""
    calls, ended = [], []
    real = edit.cost_text

    def cost_text(basis, changes, total):
        calls.append((dict(changes), threading.current_thread().name))
        if changes.get("max_seq_len") == slow_for:
            time.sleep(1.0)
        try:
            return real(basis, changes, total)
        finally:
            ended.append(dict(changes))

    monkeypatch.setattr(edit, "cost_text", cost_text)
    return calls, ended


async def test_the_cost_is_predicted_off_the_ui_thread_once_typing_pauses(monkeypatch):
    calls, _ = recording(monkeypatch)
    form = a_form()
    async with FormApp(form).run_test() as pilot:
        assert "GiB" in await settled(pilot, form)
        field = form.query_one("#param-max_seq_len", Input)
        for text in ("1", "16", "163", "1638", "16384"):  # a burst: one prediction
            field.value = text
        shown = await settled(pilot, form)
    assert [changes for changes, _ in calls] == [{}, {"max_seq_len": 16384}]
    assert all(name != threading.main_thread().name for _, name in calls)
    assert "peak memory      ≈" in shown and "of 140 GiB per GPU" in shown


async def test_an_answer_to_an_older_edit_is_dropped(monkeypatch):
    calls, ended = recording(monkeypatch, slow_for=16384)
    form = a_form()
    async with FormApp(form).run_test() as pilot:
        await settled(pilot, form)
        field = form.query_one("#param-max_seq_len", Input)
        field.value = "16384"
        while len(calls) < 2:  # the slow prediction has started
            await pilot.pause(0.05)
        field.value = "98304"
        newest = await settled(pilot, form)
        assert "4120 → ≈343" in newest  # an epoch's tokens in rows of 98304, not of 16384
        while {"max_seq_len": 16384} not in ended:  # the older answer arrives after it
            await pilot.pause(0.05)
        await pilot.pause()
        assert form.query_one("#edit-cost", Static).render().plain == newest
    assert [c.get("max_seq_len") for c, _ in calls] == [None, 16384, 98304]
    assert ended.index({"max_seq_len": 98304}) < ended.index({"max_seq_len": 16384})


def dflash_basis(peak_gib: float | None):
    """What the edit form reads of a DFlash run of the story's shape on a GPU."""
    from training.config import DFLASH_PRESETS
    from tui.predict import Basis

    params = {"max_seq_len": 8192, "block_size": 24, "max_anchors": 1024, "soft_kl": 0.15,
              "dflash_gamma": 10.0}
    start = {"event": "start", "world_size": 1, "config": {
        "model": DFLASH_PRESETS["story"].to_dict(), "device": "cuda", "max_seq_len": 8192,
        "ttt_steps": 3, "batch_rows": 1, "loss_chunk": 2048, "precision": "bf16",
        "dflash": {"target_layers": [1, 15, 29, 44, 58], "max_anchors": 1024, "gamma": 10.0,
                   "soft_kl": 0.15}}}
    return Basis(params, None, None, start, peak_gib)


def test_a_dflash_edit_predicts_its_peak_and_the_largest_anchors():
    from training.config import DFLASH_PRESETS
    from training.drafters.dflash import memory as dflash

    basis = dflash_basis(peak_gib=80.0)
    now = basis.predict({}, gpu_mem_gib=95)
    # scaled to the run's own peak (the edit form shows what the allocator will hold)
    assert now.peak_gib == pytest.approx(80.0 * 1.02, rel=0.01)
    assert now.largest_max_seq_len is None and now.fewest_checkpoint_ttt is None
    assert now.largest_max_anchors >= 1024
    more = basis.predict({"max_anchors": 2048}, gpu_mem_gib=95)
    assert more.peak_gib > now.peak_gib
    assert basis.predict({"block_size": 32}, gpu_mem_gib=95).largest_max_anchors < \
        now.largest_max_anchors
    # soft KL keeps the same chunks: the same peak
    assert basis.predict({"soft_kl": 0.0}).peak_gib == pytest.approx(now.peak_gib)
    # no measured peak yet: the analytic model
    analytic = dflash_basis(None).predict({})
    assert analytic.peak_gib == pytest.approx(dflash.predict(
        DFLASH_PRESETS["story"], dflash.DFlashShape(8192, 1024, 0.15)).reserved / 2**30)


def test_an_eagle3_edit_names_no_anchors():
    from training.config import PRESETS
    from tui.predict import Basis

    events = metrics_events(50, model=PRESETS["llama3-8b"].to_dict())
    start = next(e for e in events if e["event"] == "start")
    cost = Basis({"max_seq_len": 8192, "ttt_steps": 3}, None, None, start, 40.0).predict(
        {}, gpu_mem_gib=140)
    assert cost.largest_max_anchors is None and cost.largest_max_seq_len


async def test_an_edit_the_trainer_would_refuse_cannot_be_kept_and_a_cleared_field_leaves_the_argv():
    """epochs=2 on a --steps run: the relaunched child would die (`--epochs: not allowed
    with argument --steps`) after R had killed the healthy run; the form says so and Keep
    stays off. Clearing steps first makes the edit one the trainer takes."""
    from textual.widgets import Button

    form = a_form()
    async with FormApp(form).run_test(size=(120, 40)) as pilot:
        form.query_one("#param-epochs", Input).value = "2"
        await pilot.pause()
        assert not form.validate() and form.query_one("#keep", Button).disabled
        assert "epochs: not with steps" in form.query_one("#edit-errors", Static).render().plain
        form.query_one("#param-steps", Input).value = ""
        await pilot.pause()
        assert form.validate() and not form.query_one("#keep", Button).disabled
        assert form.changes == {"steps": None, "epochs": 2}
        assert "steps: 20000 → default (cleared)" in form.query_one("#edit-diff", Static).render().plain
