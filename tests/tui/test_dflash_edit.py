"""A DFlash run's edit form: its own knobs (block_size, max_anchors, dflash_gamma, soft_kl),
typed and checked as its trainer checks them, bad input told in a line naming the field,
and the predicted memory with the largest max_anchors that fits."""

from __future__ import annotations

import re
import time
from types import SimpleNamespace

import pytest
from textual.app import App
from textual.widgets import Button, Input, Static

from training.config import DFLASH_PRESETS
from scripts.sample import dflash_events, dflash_info, gpus, metrics_events, run_info
from tui.screens.edit import DFLASH_FIELDS, FIELDS, EditScreen, cost_text
from tui.state import HostState, RunState


class FormApp(App):
    def __init__(self, form: EditScreen) -> None:
        super().__init__()
        self.form = form
        self.kept = "not yet"

    def on_mount(self) -> None:
        self.push_screen(self.form, lambda changes: setattr(self, "kept", changes))


def a_form(events: list[dict] | None = None, info=None) -> EditScreen:
    run = RunState("h200-box/d", "h200-box", info or dflash_info())
    for event in events or dflash_events(20):
        run.add_event(event)
    return EditScreen(run, HostState("h200-box", status="ok", gpus=gpus()), {})


async def typed(pilot, form: EditScreen, **values: str) -> None:
    for name, text in values.items():
        form.query_one(f"#param-{name}", Input).value = text
    await pilot.pause()


def errors(form: EditScreen) -> list[str]:
    return form.query_one("#edit-errors", Static).render().plain.splitlines()


async def test_a_dflash_run_offers_its_own_knobs_at_their_current_values():
    form = a_form()
    async with FormApp(form).run_test(size=(120, 50)) as pilot:
        await pilot.pause()
        shown = {name: form.query_one(f"#param-{name}", Input).value for name in DFLASH_FIELDS}
        assert {k: shown[k] for k in ("block_size", "max_anchors", "dflash_gamma", "soft_kl")} == {
            "block_size": "16", "max_anchors": "1024", "dflash_gamma": "7.0", "soft_kl": "0.15"}  # fmt: skip
        assert not form.query("#param-ttt_steps") and not form.query("#param-checkpoint_ttt")
        await typed(pilot, form, max_anchors="512", dflash_gamma="7", soft_kl="0.3")
        assert form.changes == {"max_anchors": 512, "soft_kl": 0.3}  # 7 is gamma's 7.0
        await pilot.press("ctrl+s")
        assert pilot.app.kept == {"max_anchors": 512, "soft_kl": 0.3}


async def test_an_eagle3_run_keeps_its_ttt_knobs():
    form = a_form(metrics_events(5), run_info())
    assert form.fields == FIELDS
    async with FormApp(form).run_test(size=(120, 50)) as pilot:
        await pilot.pause()
        assert form.query("#param-ttt_steps") and not form.query("#param-max_anchors")


@pytest.mark.parametrize("values, message", [
    ({"block_size": "0"}, "block_size: must be ≥ 2 (got 0)"),
    ({"soft_kl": "1.5"}, "soft_kl: must be ≤ 1 (got 1.5)"),
    ({"max_anchors": "0"}, "max_anchors: must be ≥ 1 (got 0)"),
    ({"dflash_gamma": "-1"}, "dflash_gamma: must be > 0 (got -1)"),
    ({"max_anchors": "1e3"}, "max_anchors: '1e3' is not a whole number in digits"),
    # each valid alone, refused by the trainer together: the row cannot hold them
    ({"max_anchors": "16370"}, "max_anchors: must be ≤ 16,369, the blocks of 16 a row of max_seq_len 16,384 holds (got 16,370)"),
    ({"max_seq_len": "2048", "block_size": "4096"}, "block_size: must be ≤ max_seq_len 2,048 (got 4,096)"),
])
async def test_bad_input_is_one_line_naming_the_field(values, message):
    form = a_form()
    async with FormApp(form).run_test(size=(120, 50)) as pilot:
        await pilot.pause()
        await typed(pilot, form, **values)
        assert errors(form) == [message]
        assert form.query_one("#keep", Button).disabled
        await pilot.press("ctrl+s")  # refused: the form stays
        assert pilot.app.kept == "not yet" and pilot.app.screen is form


async def test_a_preset_anchor_count_is_the_trainers_to_fit_a_shorter_row():
    """Anchors not on the argv are min(preset, max_seq_len) to the trainer: no conflict."""
    info = dflash_info()
    info.params = {k: v for k, v in info.params.items() if k != "max_anchors"}
    form = a_form(info=info)
    async with FormApp(form).run_test(size=(120, 50)) as pilot:
        await pilot.pause()
        await typed(pilot, form, max_seq_len="512")
        assert errors(form) == [] and form.changes == {"max_seq_len": 512}


def predicted(**cost) -> SimpleNamespace:
    """A basis whose prediction is given: the form's text of it, whatever the memory model."""
    fields = {"steps_per_epoch": 1500, "epoch_s": 5250.0, "peak_gib": None, "largest_max_seq_len": None,
              "fewest_checkpoint_ttt": None, "largest_max_anchors": None}  # fmt: skip
    params = {"max_seq_len": 16384, "block_size": 16, "max_anchors": 1024, "soft_kl": 0.15}
    return SimpleNamespace(params=params, steps_per_epoch=1500, start={"config": {"device": "cpu"}},
                           predict=lambda changes, total=None: SimpleNamespace(**{**fields, **cost}))


def test_the_cost_names_the_largest_max_anchors_that_fits():
    text = cost_text(predicted(peak_gib=71.3, largest_max_anchors=2048), {"max_anchors": 2048}, 140.0).plain
    assert "peak memory      ≈71.3 GiB of 140 GiB per GPU\n" in text
    assert text.endswith("largest max_anchors that fits at block_size 16, max_seq_len 16384: 2048")
    assert "will not fit" not in text and "ttt" not in text


def test_anchors_past_the_largest_that_fits_will_not_fit():
    text = cost_text(predicted(peak_gib=151.0, largest_max_anchors=2048), {"max_anchors": 4096}, 140.0).plain
    assert "≈151.0 GiB of 140 GiB per GPU  — will not fit" in text


def test_no_memory_model_reads_as_a_dash():
    text = cost_text(predicted(), {"max_anchors": 2048}, 140.0).plain
    assert "peak memory      —  (a CPU run: no GPU memory to predict)" in text


async def predicted_in(form: EditScreen, pilot, **values: str) -> str:
    await typed(pilot, form, **values)
    deadline = time.monotonic() + 10
    while not form.cost_is_current or "predicting" in form.query_one("#edit-cost", Static).render().plain:
        assert time.monotonic() < deadline, "the cost never caught up with the edit"
        await pilot.pause(0.05)
    return form.query_one("#edit-cost", Static).render().plain


async def test_the_form_predicts_the_memory_of_an_edit_of_max_anchors():
    form = a_form(dflash_events(20, model=DFLASH_PRESETS["qwen3-8b"].to_dict()))
    async with FormApp(form).run_test(size=(120, 50)) as pilot:
        more = await predicted_in(form, pilot, max_anchors="2048")
        assert "steps per epoch  1500 → ≈1500" in more
        assert re.search(r"peak memory      ≈\d+\.\d GiB of 140 GiB per GPU\n", more)
        largest = int(re.search(r"largest max_anchors that fits at block_size 16, max_seq_len 16384: (\d+)", more)[1])
        fewer = await predicted_in(form, pilot, max_anchors="256")
        peak = lambda text: float(re.search(r"≈(\d+\.\d) GiB", text)[1])  # noqa: E731
        assert peak(fewer) < peak(more) and largest > 2048
        # the epoch's time grows with the block positions a row drafts
        epoch = lambda text: re.search(r"epoch time       (.*) → ≈(.*)\n", text).groups()  # noqa: E731
        now, more_s = epoch(more)
        assert epoch(fewer)[0] == now and epoch(fewer)[1] != more_s and more_s != now


async def test_a_run_with_no_drafter_shape_to_model_predicts_no_memory():
    form = a_form()
    async with FormApp(form).run_test(size=(120, 50)) as pilot:
        shown = await predicted_in(form, pilot, max_anchors="2048")
        assert "steps per epoch  1500 → ≈1500" in shown and "peak memory      —" in shown


async def test_an_edit_to_fp8_has_no_predicted_peak_and_says_why():
    """The memory model describes bf16 runs: an edit that turns --fp8 on shows no number
    rather than bf16's, and turned off again it predicts."""
    form = a_form(dflash_events(20, model=DFLASH_PRESETS["qwen3-8b"].to_dict()))
    async with FormApp(form).run_test(size=(120, 50)) as pilot:
        in_fp8 = await predicted_in(form, pilot, fp8="true")
        assert "peak memory      —  (the memory model does not describe fp8 runs (--fp8))" in in_fp8
        assert "GiB" not in in_fp8
        in_bf16 = await predicted_in(form, pilot, fp8="false")
        assert re.search(r"peak memory      ≈\d+\.\d GiB of 140 GiB per GPU\n", in_bf16)
