"""The stop's RAM mirror (training/mirror.py): its images are safetensors files the real
library reads back, the writer publishes them from inherited descriptors, a state that no
longer fits is refused rather than written wrong, and a trainer stopped through it resumes
on exactly the loss curve of a run never stopped."""
from __future__ import annotations

import os
import signal

import pytest
import torch
from safetensors.torch import load_file

from tests.training.test_checkpoint import after_start, env, events, stopped_and_durable
from tests.training.test_release_first import said, start
from training import checkpoint, durable
from training.mirror import Mirror


def state_like() -> tuple[dict, dict]:
    """Tensors of every width a checkpoint holds, sized so that a narrow one comes before
    a wide one in name order (an odd count of bf16 values would misalign what follows)."""
    weights = {"a.bf16": torch.randn(7, 3).to(torch.bfloat16), "b.f32": torch.randn(5),
               "d2t": torch.arange(9, dtype=torch.int64), "t2d": torch.rand(11) > 0.5}
    state = {"step": 12, "rng": {"torch": torch.get_rng_state(), "python": (3, (1, 2), None)},
             "optimizer": {"state": {"b.f32": {"step": torch.tensor(12.0),
                                               "exp_avg": torch.randn(5)}},
                           "param_groups": [{"betas": (0.9, 0.95), "params": ["b.f32"]}]}}
    return weights, state


def built(files: dict) -> Mirror:
    mirror = Mirror.start(files, torch.device("cpu"))
    assert mirror.ready.wait(30) and mirror.failed is None
    return mirror


def test_its_images_are_safetensors_files_and_publish_makes_the_checkpoint(tmp_path):
    weights, state = state_like()
    files, skeleton = checkpoint.tensor_files(weights, state)
    mirror = built({name: {k: torch.zeros_like(t) for k, t in f.items()}
                    for name, f in files.items()})
    images = mirror.fill(files)
    assert set(images) == {checkpoint.WEIGHTS, checkpoint.STATE_TENSORS}
    for name, fd in images.items():
        read = load_file(f"/proc/self/fd/{fd}")
        assert set(read) == set(files[name])
        for key, t in files[name].items():
            assert read[key].dtype == t.dtype and torch.equal(read[key], t), key

    staged = checkpoint.stage(tmp_path, 12, {}, skeleton, {"drafter": {}})
    path = durable.publish(staged, tmp_path, 12, images)
    with pytest.raises(OSError):  # publish closed them
        os.fstat(images[checkpoint.WEIGHTS])
    loaded_weights, loaded_state, _ = checkpoint.load(path)
    assert all(torch.equal(loaded_weights[k], t) for k, t in weights.items())
    assert loaded_state["rng"]["python"] == (3, (1, 2), None)
    assert loaded_state["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.95)
    assert torch.equal(loaded_state["optimizer"]["state"]["b.f32"]["exp_avg"],
                       state["optimizer"]["state"]["b.f32"]["exp_avg"])


def test_a_state_that_no_longer_fits_its_layout_is_refused(tmp_path):
    weights, state = state_like()
    files, _ = checkpoint.tensor_files(weights, state)
    mirror = built(files)
    grown = {**files, checkpoint.WEIGHTS: {**weights, "b.f32": torch.randn(6)}}
    assert mirror.fill(grown) is None
    assert "changed since it was laid out" in mirror.failed
    assert mirror.fill({checkpoint.WEIGHTS: weights}) is None


@pytest.mark.slow
def test_a_trainer_stopped_through_the_mirror_resumes_on_the_uninterrupted_curve(
        tmp_path, tmp_path_factory):
    environ = env(tmp_path_factory)
    run_dir = tmp_path / "run"
    proc = start(run_dir, environ, "--save-every", "0")
    assert after_start(run_dir, lambda: sum(e["event"] == "step" for e in events(run_dir)) >= 20, 60)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, said(proc)
    assert "state written to RAM made ready for it" in said(proc)
    stopped = stopped_and_durable(run_dir)
    before = len(events(run_dir))
    proc = start(run_dir, environ, "--save-every", "0", "--resume")
    assert after_start(run_dir, lambda: sum(e["event"] == "step" for e in events(run_dir)) >= stopped + 10, 60, before)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0

    resumed = [e for e in events(run_dir) if e["event"] == "step" and e["step"] > stopped]
    reference = tmp_path / "reference"
    proc = start(reference, environ, "--save-every", "0")
    assert after_start(reference, lambda: sum(e["event"] == "step" for e in events(reference)) >= resumed[-1]["step"], 60)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    expected = {e["step"]: e["loss"] for e in events(reference) if e["event"] == "step"}
    assert len(resumed) >= 10
    for e in resumed:
        assert e["loss"] == pytest.approx(expected[e["step"]], rel=1e-6), e["step"]


@pytest.mark.gpu
def test_on_a_gpu_the_mirror_is_page_locked_filled_from_the_device_and_unpinned():
    device = torch.device("cuda")
    weights, state = state_like()
    on_gpu = {k: t.to(device) for k, t in weights.items()}
    files, _ = checkpoint.tensor_files(on_gpu, state)
    mirror = Mirror.start(files, device)
    assert mirror.ready.wait(60) and mirror.failed is None
    assert all(image.pinned for image in mirror.images.values())
    images = mirror.fill(files)
    read = load_file(f"/proc/self/fd/{images[checkpoint.WEIGHTS]}")
    assert all(torch.equal(read[k], t) for k, t in weights.items())
    mirror.unpin()
    assert not any(image.pinned for image in mirror.images.values())
    assert torch.equal(load_file(f"/proc/self/fd/{images[checkpoint.WEIGHTS]}")["b.f32"], weights["b.f32"])
