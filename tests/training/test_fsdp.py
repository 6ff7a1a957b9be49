"""`--sharding fsdp` (FSDP2) trains as DDP does, and its checkpoints resume at another world
size and under the other sharding.

Two torchrun launches of 2 CPU processes (gloo), one per sharding, at the same global
batch: FSDP all-gathers weights and reduce-scatters gradients where DDP all-reduces them,
so the two may differ only in float summation order — a relative tolerance of 1e-5 per
step, as tests/training/test_torchrun.py allows DDP against one process (measured: equal,
all 3 steps). Each run's step-2 checkpoint then resumes in this process, at world size 1
with the same global batch (2 rows), under the other sharding: its step 3 matches the
uninterrupted run's step 3 (measured: 3e-8 relative), and so do the weights and AdamW
state it saves after it (to 1e-5 relative, 1e-7 absolute; measured: 7e-9 absolute).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

from training import checkpoint
from training.cli import main
from training.config import DFLASH_PRESETS, PRESETS
from training.drafters.dflash.model import DFlashDrafter
from training.optimizer import make_optimizer
from training.drafters.dflash import memory as dflash_memory
from training.drafters.eagle3.model import Eagle3Drafter

ROOT = Path(__file__).resolve().parents[2]
RUN = ["train", "--synthetic", "--steps", "3", "--max-seq-len", "256", "--ttt-steps", "2",
       "--save-every", "2"]


def events(run_dir: Path, kind: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == kind]


def losses(run_dir: Path) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in events(run_dir, "step")}


def resume_from_step_2(run_dir: Path, copy: Path, argv: list[str]) -> None:
    """Resume `run_dir`'s step-2 checkpoint in this process, in a copy of it."""
    shutil.copytree(run_dir, copy, symlinks=True)
    shutil.rmtree(copy / "checkpoints" / "step-3")
    assert main(RUN + argv + ["--out", str(copy), "--resume"]) == 0


def assert_same_checkpoint(a: Path, b: Path) -> None:
    (weights_a, state_a, _), (weights_b, state_b, _) = checkpoint.load(a), checkpoint.load(b)
    assert weights_a.keys() == weights_b.keys()
    for name in weights_a:
        torch.testing.assert_close(weights_a[name], weights_b[name], rtol=1e-5, atol=1e-7)
    optim_a, optim_b = state_a["optimizer"], state_b["optimizer"]
    # (set_optimizer_state_dict hands AdamW's betas back as a list, not a tuple)
    assert [{**g, "betas": tuple(g["betas"])} for g in optim_a["param_groups"]] == \
        [{**g, "betas": tuple(g["betas"])} for g in optim_b["param_groups"]]
    assert optim_a["state"].keys() == optim_b["state"].keys()
    for name, moments in optim_a["state"].items():
        for key, value in moments.items():
            torch.testing.assert_close(value, optim_b["state"][name][key], rtol=1e-5,
                                       atol=1e-7, msg=f"{name} {key}")


@pytest.mark.slow
def test_fsdp_trains_as_ddp_over_two_ranks_and_resumes_at_one_under_the_other(cache,
                                                                                tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    launches = {
        sharding: subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--standalone",
             "--nproc_per_node", "2", "-m", "training", *RUN, "--batch-rows", "1",
             "--sharding", sharding, "--out", str(tmp_path / sharding)],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for sharding in ("fsdp", "ddp")}
    for sharding, launch in launches.items():
        _, err = launch.communicate(timeout=180)
        assert launch.returncode == 0, f"{sharding}: {err[-3000:]}"
        start = events(tmp_path / sharding, "start")[0]
        assert start["world_size"] == 2 and start["config"]["sharding"] == sharding

    fsdp, ddp = losses(tmp_path / "fsdp"), losses(tmp_path / "ddp")
    assert list(fsdp) == list(ddp) == [1, 2, 3]
    for step in fsdp:
        assert fsdp[step] == pytest.approx(ddp[step], rel=1e-5), step

    # FSDP at 2 → DDP (one process) at 1, and DDP at 2 → FSDP at 1.
    for run, resumed, sharding in (("fsdp", "fsdp-to-1", "ddp"), ("ddp", "ddp-to-1", "fsdp")):
        resume_from_step_2(tmp_path / run, tmp_path / resumed,
                           ["--batch-rows", "2", "--sharding", sharding])
        start = events(tmp_path / resumed, "start")[-1]
        assert start["config"]["resumed_from_step"] == 2 and start["world_size"] == 1
        assert losses(tmp_path / resumed)[3] == pytest.approx(losses(tmp_path / run)[3],
                                                              rel=1e-5)
        assert_same_checkpoint(tmp_path / run / "checkpoints" / "step-3",
                               tmp_path / resumed / "checkpoints" / "step-3")


@pytest.mark.parametrize("fp8", [False, True])
def test_dflash_layers_shard_and_train_as_unsharded(cache, tmp_path, fp8):
    # One process: FSDP's groups over a mesh of one, each draft layer its own (in fp8 too,
    # whose casts must read a layer's weights where FSDP has gathered them).
    for sharding in ("ddp", "fsdp"):
        assert main(["train", "--synthetic", "--drafter", "dflash", "--steps", "2",
                     "--max-seq-len", "128", "--save-every", "0", "--sharding", sharding,
                     *(["--fp8"] if fp8 else []), "--out", str(tmp_path / sharding)]) == 0
    assert losses(tmp_path / "fsdp") == pytest.approx(losses(tmp_path / "ddp"), rel=1e-5)
    assert_same_checkpoint(tmp_path / "ddp" / "checkpoints" / "step-2",
                           tmp_path / "fsdp" / "checkpoints" / "step-2")


def test_eagle3_in_fp8_shards_and_trains_as_unsharded(cache, tmp_path):
    # One process, a mesh of one: the layer's fp8 casts (once per unroll, before its
    # forward) and a frozen head's read the root group's gathered weights.
    for sharding in ("ddp", "fsdp"):
        assert main(RUN + ["--fp8", "--freeze-lm-head", "--save-every", "0", "--sharding",
                           sharding, "--out", str(tmp_path / sharding)]) == 0
    assert losses(tmp_path / "fsdp") == pytest.approx(losses(tmp_path / "ddp"), rel=1e-5)


def test_a_checkpoint_from_before_fsdp_reads_by_parameter_name():
    # Its optimizer state was keyed by the order the trained parameters were handed over.
    torch.manual_seed(0)
    drafter = Eagle3Drafter(PRESETS["tiny"])
    trained = {n: p for n, p in drafter.named_parameters() if p.requires_grad}
    optimizer = make_optimizer(trained.values(), 1e-3, torch.device("cpu"))
    for p in trained.values():
        p.grad = torch.randn_like(p)
    optimizer.step()
    by_name = checkpoint.optimizer_by_name(optimizer.state_dict(), list(trained))
    expected = get_optimizer_state_dict(drafter, optimizer)
    assert by_name["param_groups"] == expected["param_groups"]
    assert by_name["state"].keys() == expected["state"].keys()
    for name, moments in expected["state"].items():
        for key, value in moments.items():
            assert torch.equal(by_name["state"][name][key], value)
    assert checkpoint.optimizer_by_name(expected, []) is expected


def test_the_memory_model_gathers_what_fsdp_groups_hold():
    # DFlash: the root group (all but the layers) for the whole step and two layers at once
    cfg = DFLASH_PRESETS["tiny"]
    drafter = DFlashDrafter(cfg)
    layer = sum(p.numel() for p in drafter.layers[0].parameters())
    root = sum(p.numel() for p in drafter.parameters()) - cfg.num_layers * layer
    assert cfg.num_layers >= 2
    assert dflash_memory.gathered_parameters(cfg) == root + 2 * layer
    shape = dflash_memory.DFlashShape(512, 64, world_size=4, sharding="fsdp")
    state = dflash_memory.phases(cfg, shape)["layer_backward"]["constant"]
    trained = sum(p.numel() for p in drafter.parameters())
    assert state["fsdp_gathered"] == (root + 2 * layer) * 4
    assert state["adamw_state"] == 2 * trained * 4 // 4 and "ddp_buckets" not in state


def test_fit_predicts_a_sharded_dflash_step(capsys):
    def fit(*sharding: str) -> dict:
        assert main(["fit", "--drafter", "dflash", "--preset", "story", "--world-size", "8",
                     "--json", *sharding]) == 0
        return json.loads(capsys.readouterr().out)

    ddp, fsdp = fit(), fit("--sharding", "fsdp")
    assert fsdp["shape"]["sharding"] == "fsdp" and ddp["shape"]["sharding"] == "ddp"
    assert "fsdp_gathered" in fsdp["breakdown_bytes"] and fsdp["peak_gib"] < ddp["peak_gib"]
    # and the text says which it predicted
    assert main(["fit", "--drafter", "dflash", "--preset", "story", "--world-size", "8",
                 "--sharding", "fsdp"]) == 0
    assert "8 GPU(s) fsdp" in capsys.readouterr().out


def test_fsdp_finds_the_eagle3_step_outputs_as_torch_2_11_looks_for_them(cache, tmp_path,
                                                                         monkeypatch):
    # torch 2.11's FSDP hooks its gradient reduction on the outputs pytree finds, blind to a
    # dataclass: given StepLoss objects, no gradient reached a sharded parameter (an H200,
    # grad_norm 0). 2.13 looks inside dataclasses; the trainer must not depend on it.
    from torch.distributed.fsdp._fully_shard import _fsdp_state
    from torch.utils._pytree import tree_flatten

    monkeypatch.setattr(_fsdp_state, "collect_grad_tensors", lambda out: tuple(
        t for t in tree_flatten(out)[0] if torch.is_tensor(t) and t.requires_grad))
    assert main(["train", "--synthetic", "--steps", "1", "--max-seq-len", "128",
                 "--save-every", "0", "--sharding", "fsdp", "--out", str(tmp_path)]) == 0
    assert events(tmp_path, "step")[0]["grad_norm"] > 0
