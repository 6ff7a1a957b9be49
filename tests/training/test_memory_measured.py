"""The memory models against peaks measured on NVIDIA H200s and recorded in bench/results.

Each test reads the measured peak and the shape it was taken at from the recorded file
(the command that made it is in the file, and in docs/benchmarks.md), so the model is
checked against the GPU, not against a copy of its own formula. The bound is issue 26's:
a prediction within 10 % of what the card measured, uncalibrated; a calibration fitted on
some measured points predicts the others within the same bound.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from training.drafters.eagle3 import memory
from training.config import DFLASH_PRESETS, PRESETS
from training.drafters.dflash import memory as dflash
from training.drafters.dflash.memory import DFlashShape
from training.drafters.eagle3.memory import GiB, Measurement, StepShape
from training.drafters.measured import shape_from_start

RESULTS = Path(__file__).resolve().parents[2] / "bench/results"
TOLERANCE = 0.10

# The EAGLE-3 trainer as it is now: every point of this record is of the current trainer
# (older records describe earlier trainers, whose peaks have since fallen).
EAGLE3 = json.loads((RESULTS / "h200-peaks-session11.json").read_text())
# kimi-k2 at 65,536 × TTT 5, every TTT step recomputed (bench/train_step.py's
# trackside+ckpt): the largest EAGLE-3 step measured on the current trainer.
KIMI_64K = json.loads((RESULTS / "h200-kimi64k-session14.json").read_text())
# DFlash as the trainer is now (bench/dflash_step.py's JSON records): qwen3-8b at its block
# size, at two row lengths; the story's preset capped at 95 GiB, chunked and unchunked.
DFLASH_QWEN = json.loads((RESULTS / "h200-dflash-session14-call3-step.json").read_text())
DFLASH_STORY = json.loads((RESULTS / "h200-dflash-session14-call3-story.json").read_text())
# The story's OOM, met by the unchunked loss when its pass held float32 copies of the
# logits (as the eager pass, CPU's, still does): bench/dflash_step.py's log lines.
DFLASH_STORY_OOM = RESULTS / "h200-dflash-session13-story.log"


def _shape(point: dict) -> StepShape:
    return StepShape(point["max_seq_len"], point["ttt_steps"],
                     checkpoint_ttt=point["checkpoint_ttt"],
                     freeze_lm_head=point["freeze_lm_head"])


def _measurement(point: dict) -> Measurement:
    return Measurement(point["max_seq_len"], point["ttt_steps"],
                       round(point["peak_gib"] * GiB), round(point["reserved_gib"] * GiB))


def _label(point: dict) -> str:
    return (f"{point['preset']}-{point['max_seq_len']}x{point['ttt_steps']}"
            f"-ckpt{point['checkpoint_ttt']}{'-frozen' if point['freeze_lm_head'] else ''}")


@pytest.mark.parametrize("point", EAGLE3["points"], ids=_label)
def test_eagle3_peak_uncalibrated_within_10_percent(point):
    """max_memory_allocated of the trainer's steps against the analytic model, no
    calibration (seen -1.7 % to -0.2 % over the record's six points)."""
    predicted = memory.predict(PRESETS[point["preset"]], _shape(point))
    error = predicted.total / GiB / point["peak_gib"] - 1
    assert abs(error) < TOLERANCE, f"{error:+.1%}"


@pytest.mark.parametrize("point", EAGLE3["points"], ids=_label)
def test_eagle3_reserved_never_below_what_the_allocator_held(point):
    """What a memory cap is checked against, the caching allocator's reserve at the peak
    (under the trainer's expandable segments), against max_memory_reserved: never below
    it, so a step predicted to fit does, and within 5 % above (seen +1.9 % to +4.1 %)."""
    assert EAGLE3["allocator"] == "expandable_segments:True"
    predicted = memory.predict(PRESETS[point["preset"]], _shape(point))
    error = predicted.reserved / GiB / point["reserved_gib"] - 1
    assert 0 <= error < 0.05, f"{error:+.1%}"


def test_kimi_k2_65536_all_recomputed_uncalibrated_within_10_percent():
    (result,) = KIMI_64K["results"]
    assert result["trainer"] == "trackside+ckpt"  # head trained, every step recomputed
    preset, length, ttt = result["cell"].split(":")
    shape = StepShape(int(length), int(ttt), checkpoint_ttt=int(ttt))
    error = memory.predict(PRESETS[preset], shape).total / GiB / result["peak_gib"] - 1
    assert abs(error) < TOLERANCE, f"{error:+.1%}"


def _points(freeze_lm_head: bool) -> list[dict]:
    return [p for p in EAGLE3["points"] if p["freeze_lm_head"] == freeze_lm_head]


@pytest.mark.parametrize("freeze_lm_head", [False, True], ids=["trained-head", "frozen-head"])
def test_calibrated_on_the_shortest_measured_step_predicts_the_longer_ones(freeze_lm_head):
    """A calibration fitted on the measured 8192-token step alone (what a probe or a
    finished run gives) reproduces it and predicts the record's longer steps, up to
    32768 × TTT 7 and with steps recomputed, within 10 % (seen within 1.1 %)."""
    points = _points(freeze_lm_head)
    shortest = min(points, key=lambda p: (p["max_seq_len"], p["ttt_steps"]))
    cfg = PRESETS[shortest["preset"]]
    cal = memory.calibrate(cfg, [_measurement(shortest)], _shape(shortest))
    for point in points:
        predicted = memory.predict(cfg, _shape(point), cal).total
        error = predicted / GiB / point["peak_gib"] - 1
        if point is shortest:
            assert error == pytest.approx(0, abs=1e-3)
        else:
            assert abs(error) < TOLERANCE, (_label(point), f"{error:+.1%}")


def test_calibrated_on_two_measured_lengths_fits_both_and_extrapolates_in_ttt():
    """Two measured lengths at one TTT depth (8192 and 16384 × 5) are matched, and the
    measured 32768 × TTT 7, twice as long and two steps deeper, is predicted within 10 %
    (seen +2.4 %). The allocator's slack is the largest measured step's own."""
    trained = [p for p in _points(False) if p["checkpoint_ttt"] == 0]
    fitted = [p for p in trained if p["ttt_steps"] == 5]
    (far,) = [p for p in trained if p["ttt_steps"] == 7]
    cfg = PRESETS[far["preset"]]
    cal = memory.calibrate(cfg, [_measurement(p) for p in fitted])
    for point in fitted:
        assert memory.predict(cfg, _shape(point), cal).total / GiB == pytest.approx(
            point["peak_gib"], rel=1e-3)
    error = memory.predict(cfg, _shape(far), cal).total / GiB / far["peak_gib"] - 1
    assert abs(error) < TOLERANCE, f"{error:+.1%}"
    largest = max(fitted, key=lambda p: p["peak_gib"])
    assert cal.reserved_slack == _measurement(largest).reserved_bytes \
        - _measurement(largest).peak_bytes


def _dflash_trained(record: dict) -> list[dict]:
    return [r for r in record["results"] if r["trainer"] == "trackside" and "peak_gib" in r
            and not r.get("oom") and not r.get("loss_pass")]


def _dflash_shape(result: dict) -> DFlashShape:
    return DFlashShape(result["max_seq_len"], result["max_anchors"],
                       soft_kl=result["soft_kl"], loss_chunk=result["loss_chunk"])


def _dflash_label(result: dict) -> str:
    return f"{result['preset']}-{result['max_seq_len']}x{result['max_anchors']}-chunk" \
        f"{result['loss_chunk']}"


@pytest.mark.parametrize("result", _dflash_trained(DFLASH_QWEN) + _dflash_trained(DFLASH_STORY),
                         ids=_dflash_label)
def test_dflash_peak_uncalibrated_within_10_percent(result):
    """qwen3-8b's drafter (block 16, 512 anchors over 8192 tokens and 384 over 6144) and the
    story's (block 24 × 1024 anchors, soft KL, capped at 95 GiB; chunked, and unchunked
    with the Triton pass): seen -0.1 % to +4.4 %."""
    cfg = DFLASH_PRESETS[result["preset"]]
    assert cfg.block_size == result["block_size"]
    predicted = dflash.predict(cfg, _dflash_shape(result))
    error = predicted.total / GiB / result["peak_gib"] - 1
    assert abs(error) < TOLERANCE, f"{error:+.1%}"


def test_dflash_the_story_chunked_fits_95_gib_as_predicted():
    (chunked,) = [r for r in _dflash_trained(DFLASH_STORY) if r["loss_chunk"] == 2048]
    assert chunked["cap_gib"] == 95 and chunked["peak_gib"] < 95
    assert memory.fits(dflash.predict(DFLASH_PRESETS["story"], _dflash_shape(chunked)), 95)


def test_dflash_scale_fitted_on_qwen3_8b_predicts_the_story():
    """A scale fitted on the measured qwen3-8b step at 8192 tokens reproduces it and
    predicts the story's measured steps, another drafter with twice the anchors and a
    wider block, within 10 %."""
    (result,) = [r for r in _dflash_trained(DFLASH_QWEN) if r["max_seq_len"] == 8192]
    cfg = DFLASH_PRESETS[result["preset"]]
    shape = _dflash_shape(result)
    scale = dflash.calibrate(cfg, shape, round(result["peak_gib"] * GiB))
    assert dflash.predict(cfg, shape, scale).total / GiB == pytest.approx(
        result["peak_gib"], rel=1e-4)
    for story in _dflash_trained(DFLASH_STORY):
        predicted = dflash.predict(DFLASH_PRESETS[story["preset"]], _dflash_shape(story),
                                   scale)
        error = predicted.total / GiB / story["peak_gib"] - 1
        assert abs(error) < TOLERANCE, (_dflash_label(story), f"{error:+.1%}")


_STORY_LINE = re.compile(
    r"^trackside\s+(?P<preset>\S+) L (?P<max_seq_len>\d+) anchors (?P<max_anchors>\d+) "
    r"block (?P<block_size>\d+) soft KL (?P<soft_kl>[\d.]+) chunk (?P<loss_chunk>\d+) "
    r"cap (?P<cap_gib>\d+) GiB: OOM.*Tried to allocate (?P<tried_gib>[\d.]+) GiB")


def test_dflash_the_storys_oom_was_one_float32_positions_by_vocabulary_tensor():
    """The story's OOM (session 13's record, its loss pass then unfused): the tensor torch
    failed to allocate is [positions × vocabulary] float32, positions = anchors × (block
    - 1): one of the float copies the eager pass holds (loss_chunk_bytes, fused=False),
    where the Triton pass holds the bf16 logits alone (and trained unchunked, above)."""
    (m,) = [m for line in DFLASH_STORY_OOM.read_text().splitlines()
            if (m := _STORY_LINE.match(line))]
    cfg = DFLASH_PRESETS[m["preset"]]
    P = int(m["max_anchors"]) * (int(m["block_size"]) - 1)
    assert int(m["loss_chunk"]) == P
    # torch's "Tried to allocate" is rounded to 0.01 GiB: a few positions either way
    positions = float(m["tried_gib"]) * GiB / (cfg.vocab_size * 4)
    assert positions == pytest.approx(P, abs=8)
    eager = dflash.loss_chunk_bytes(cfg.vocab_size, P, "bf16", float(m["soft_kl"]), fused=False)
    assert eager > float(m["tried_gib"]) * GiB  # the eager pass holds it and more


@pytest.mark.parametrize("config", [["a", "list"], "text", {"model": "text", "ttt_steps": 3, "max_seq_len": 8192},
                                    {"model": {"hidden_size": "x"}, "ttt_steps": 3, "max_seq_len": 8192},
                                    {"dflash": {"max_anchors": 8}, "model": ["x"], "max_seq_len": 8192}])
def test_a_start_event_not_the_trainers_is_a_value_error(config):
    """A run dir may be anyone's: whatever its start event holds, the memory model refuses it
    with a ValueError (the edit form's "—" and its reason), never another exception."""
    with pytest.raises(ValueError):
        shape_from_start({"event": "start", "config": config})
