"""The DFlash memory model (training/drafters/dflash/memory.py) and `trackside fit --drafter
dflash`: the drafter's real parameter count, the chunked loss's measured working set on
the CPU, the story's OOM unchunked, the largest max_anchors and block size that fit, and
a run's start event read back."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from training import fit
from training.config import DFLASH_PRESETS
from training.drafters.dflash.loss import block_loss, verifier_tokens
from training.drafters.dflash.model import DFlashDrafter
from training.drafters.dflash import memory as model
from training.drafters.dflash.memory import DFlashShape
from training.drafters.eagle3 import memory
from training.memory.units import GiB

STORY = DFLASH_PRESETS["story"]
STORY_SHAPE = DFlashShape(8192, 1024, soft_kl=0.15)


def test_the_parameter_count_is_the_drafters():
    cfg = dataclasses.replace(DFLASH_PRESETS["tiny"], num_layers=3, num_target_layers=4)
    drafter = DFlashDrafter(cfg)
    counts = model.parameter_counts(cfg)
    assert counts["trainable"] == sum(p.numel() for p in drafter.parameters())
    assert counts["frozen"] == drafter.embed_tokens.numel() + drafter.lm_head.numel()
    per_layer = sum(p.numel() for p in drafter.layers[0].parameters())
    assert counts["layer"] == per_layer


@pytest.mark.parametrize("soft_kl", [0.0, 0.15])
def test_the_loss_working_set_is_what_the_cpu_measures(peak_allocated_bytes, soft_kl):
    g = torch.Generator().manual_seed(0)
    P, H, V, chunk = 1024, 8, 4096, 64
    hidden = torch.randn(P, H, generator=g, requires_grad=True)
    head, target = torch.randn(V, H, generator=g), torch.randn(P, H, generator=g)

    # as the drafter scores: the verifier's hidden states for the soft KL, else its tokens
    if not soft_kl:
        target = verifier_tokens(target, torch.unique(torch.arange(P), return_inverse=True),
                                 head, torch.float32)

    def run():
        block_loss(hidden, head, target, torch.ones(P), soft_kl, chunk)[0].backward()
    measured = peak_allocated_bytes(run)
    predicted = model.loss_chunk_bytes(V, chunk, "fp32", soft_kl, fused=False) + P * H * 4
    assert abs(measured - predicted) / measured < 0.1


def test_the_story_fits_95_gib_chunked_and_not_unchunked():
    chunked = model.predict(STORY, STORY_SHAPE)
    assert memory.fits(chunked, 95)
    # one chunk holding every scored position: both sides' [positions × vocabulary]
    # logits whole (bf16, 12.2 GB each: the story's tensors)
    whole = dataclasses.replace(STORY_SHAPE, loss_chunk=1024 * 23)
    unchunked = model.predict(STORY, whole)
    assert unchunked.phase == "loss_forward"
    assert not memory.fits(unchunked, 95)
    assert unchunked.breakdown()["loss_chunk"] == 2 * 1024 * 23 * STORY.vocab_size * 2
    # without the soft KL the loss holds the drafter's logits alone
    ce_only = model.predict(STORY, dataclasses.replace(whole, soft_kl=0.0))
    assert ce_only.breakdown()["loss_chunk"] == unchunked.breakdown()["loss_chunk"] // 2


def test_the_peak_grows_with_anchors_and_block_size():
    peaks = [model.predict(STORY, dataclasses.replace(STORY_SHAPE, max_anchors=n)).total
             for n in (256, 512, 1024, 2048)]
    assert peaks == sorted(peaks) and len(set(peaks)) == 4
    blocks = [model.predict(dataclasses.replace(STORY, block_size=b), STORY_SHAPE).total
              for b in (8, 16, 24, 32)]
    assert blocks == sorted(blocks) and len(set(blocks)) == 4


def test_largest_max_anchors_and_block_size_are_the_edge_of_fitting():
    n = model.largest_max_anchors(STORY, STORY_SHAPE, 95, multiple=64)
    assert n % 64 == 0 and n >= 1024

    def fits(cfg, anchors):
        return memory.fits(model.predict(cfg, dataclasses.replace(STORY_SHAPE,
                                                                  max_anchors=anchors)), 95)
    assert fits(STORY, n) and not fits(STORY, n + 64)
    b = model.largest_block_size(STORY, STORY_SHAPE, 95)
    assert fits(dataclasses.replace(STORY, block_size=b), 1024)
    assert not fits(dataclasses.replace(STORY, block_size=b + 1), 1024)
    # a card that holds every anchor a row has room for names that room
    assert model.largest_max_anchors(DFLASH_PRESETS["tiny"], DFlashShape(256, 8), 80) == \
        256 - DFLASH_PRESETS["tiny"].block_size + 1


def test_a_peak_the_model_cannot_describe_is_refused():
    # Fitting measured peaks, and predicting others from the fit, is
    # test_memory_measured.py's (the H200 records); here a peak no scale of the growing
    # terms reaches within a factor of two.
    with pytest.raises(ValueError, match="does not fit"):
        model.calibrate(STORY, STORY_SHAPE, 10 * GiB)  # below the weights alone
    with pytest.raises(ValueError, match="does not fit"):
        model.calibrate(STORY, STORY_SHAPE, 1000 * GiB)  # more than any card holds


def run_fit(capsys, *args):
    rc = fit.main(["fit", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_fit_names_the_largest_anchors_and_the_unchunked_oom(capsys):
    rc, out, _ = run_fit(capsys, "--drafter", "dflash", "--preset", "story",
                         "--gpu-mem-gib", "95", "--json")
    assert rc == 0
    r = json.loads(out)
    assert r["fits"] and r["shape"]["max_anchors"] == 1024 and r["shape"]["soft_kl"] == 0.15
    assert r["largest_max_anchors"] == model.largest_max_anchors(STORY, STORY_SHAPE, 95)
    assert r["largest_block_size"] >= 24
    rc, out, _ = run_fit(capsys, "--drafter", "dflash", "--preset", "story",
                         "--gpu-mem-gib", "95", "--loss-chunk", "23552")
    assert rc == 0 and "will not fit" in out and "the whole loss at once" in out


@pytest.mark.parametrize("args, flag", [
    (["--ttt-steps", "3"], "--ttt-steps"),
    (["--probe"], "--probe"),
    (["--block-size", "1"], "--block-size"),
    (["--soft-kl", "2"], "--soft-kl"),
    (["--max-anchors", "8190"], "--max-anchors"),  # 8192 - 24 + 1 is a row's room
    (["--preset", "kimi-k2"], "--preset"),
])
def test_fit_dflash_refuses_bad_flags_naming_them(args, flag, capsys):
    base = ["--drafter", "dflash", "--preset", "story"]
    rc, _, err = run_fit(capsys, *base, *args)
    assert rc == 2 and flag in err


def test_fit_eagle3_refuses_dflash_flags(capsys):
    rc, _, err = run_fit(capsys, "--preset", "tiny", "--max-anchors", "8")
    assert rc == 2 and "--max-anchors" in err


def dflash_run(tmp_path, peak_gib: float):
    """A DFlash run directory as the trainer writes it, on a GPU."""
    cfg = DFLASH_PRESETS["qwen3-8b"]
    start = {"event": "start", "world_size": 1, "config": {
        "model": cfg.to_dict(), "device": "cuda", "max_seq_len": 8192, "ttt_steps": 3,
        "batch_rows": 1, "loss_chunk": 2048, "precision": "bf16",
        "dflash": {"target_layers": [1, 9, 17, 25, 33], "max_anchors": 512, "gamma": 7.0,
                   "soft_kl": 0.0}}}
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps(start) + "\n" + json.dumps(
        {"event": "step", "step": 1, "peak_mem_gib": peak_gib}) + "\n")
    return run, cfg


def test_a_dflash_start_event_reads_back_as_its_shape(tmp_path):
    run, cfg = dflash_run(tmp_path, 30.0)
    got_cfg, shape, peak = model.dflash_from_run(run)
    assert got_cfg == cfg and shape == DFlashShape(8192, 512)
    assert peak == 30 * GiB
    with pytest.raises(ValueError, match="DFlash"):
        memory.measurements_from_run(run)


def test_fit_from_a_dflash_run_scales_to_its_peak(tmp_path, capsys):
    run, _ = dflash_run(tmp_path, 30.0)
    rc, out, _ = run_fit(capsys, "--drafter", "dflash", "--from-run", str(run), "--json")
    r = json.loads(out)
    assert rc == 0 and r["peak_gib"] == pytest.approx(30.0, rel=1e-6)
    assert r["scale"] != 1.0 and r["calibrated_on"]["peak_gib"] == pytest.approx(30.0)
