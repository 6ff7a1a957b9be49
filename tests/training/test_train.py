"""The trainer end to end on CPU: the metrics contract, a loss that falls, the loader, the
export."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.waiting import niced
from training.checkpoint import latest
from training.config import PRESETS
from training.data import Dataset, Loader, Position
from training.drafters.eagle3.export import export_drafter
from training.loop import EXIT_OOM, TrainConfig, _tried_gib, record_oom, train
from training.metrics import EVENT_FIELDS, MetricsWriter
from training.optimizer import optimizer_step
from training.synthetic import synthetic_dataset

ROOT = Path(__file__).resolve().parents[2]


def number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def check_event(event: dict, ttt_steps: int) -> None:
    """Every field of every event, as DESIGN.md's contract lists them."""
    kind = event["event"]
    assert set(event) == {"event", "time", *EVENT_FIELDS[kind]}, event
    assert number(event["time"])
    if kind == "start":
        assert isinstance(event["config"], dict)
        assert event["config"]["max_seq_len"] > 0
        assert event["config"]["ttt_steps"] == ttt_steps
        assert isinstance(event["steps_per_epoch"], int) and event["steps_per_epoch"] > 0
        assert event["world_size"] >= 1
    elif kind == "step":
        assert isinstance(event["step"], int) and event["step"] >= 1
        assert isinstance(event["epoch"], int) and event["epoch"] >= 0
        for name in ("loss", "lr", "grad_norm", "tokens_per_s", "samples_per_row",
                     "pad_frac", "peak_mem_gib"):
            assert number(event[name]) and event[name] >= 0, name
        assert event["lr"] > 0 and event["tokens_per_s"] > 0 and event["peak_mem_gib"] > 0
        assert isinstance(event["tokens"], int) and event["tokens"] > 0
        assert 0 <= event["pad_frac"] < 1 and event["samples_per_row"] >= 1
        assert len(event["loss_ttt"]) == len(event["acc_ttt"]) == ttt_steps
        assert all(number(x) and x >= 0 for x in event["loss_ttt"])
        assert all(number(x) and 0 <= x <= 1 for x in event["acc_ttt"])
        weighted = sum(0.8 ** k * x for k, x in enumerate(event["loss_ttt"]))
        assert event["loss"] == pytest.approx(weighted, rel=1e-6)
    elif kind == "checkpoint":
        assert isinstance(event["step"], int)
        assert (Path(event["path"]) / "model.safetensors").is_file()
    elif kind == "oom":
        assert all(event[k] is None or number(event[k]) for k in EVENT_FIELDS["oom"])
    elif kind == "end":
        assert event["status"] in ("completed", "stopped", "oom", "failed")


def read_events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("scale", [0.01, 50.0])  # below the clip, and clipped
@pytest.mark.parametrize("fused", [True, False])
def test_the_step_clips_as_clip_grad_norm_does_fused_or_not(scale, fused):
    """Fused AdamW takes the clip as its grad_scale (no pass of its own over the
    gradients); the result is torch's clip_grad_norm_ then step, whichever path ran."""
    g = torch.Generator().manual_seed(0)
    shapes = [(64, 32), (32,), (7, 5, 3)]
    weights = [torch.randn(s, generator=g) for s in shapes]
    grads = [scale * torch.randn(s, generator=g) for s in shapes]
    ours = [torch.nn.Parameter(w.clone()) for w in weights]
    theirs = [torch.nn.Parameter(w.clone()) for w in weights]
    opt = torch.optim.AdamW(ours, lr=1e-2, betas=(0.9, 0.95), fused=fused)
    ref = torch.optim.AdamW(theirs, lr=1e-2, betas=(0.9, 0.95))
    for step in range(3):
        for p, q, gr in zip(ours, theirs, grads):
            p.grad, q.grad = gr * (step + 1), gr.clone() * (step + 1)
        norm = optimizer_step(opt, ours, 1.0)
        ref_norm = torch.nn.utils.clip_grad_norm_(theirs, 1.0)
        ref.step()
        ref.zero_grad(set_to_none=True)
        assert norm.item() == pytest.approx(ref_norm.item(), rel=1e-6)
        assert all(p.grad is None for p in ours) and not hasattr(opt, "grad_scale")
        for p, q in zip(ours, theirs):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


@pytest.mark.timeout(1200)  # a bound for a hang: at nice 10 beside two busy loops it took over 600 s
def test_synthetic_200_steps_meet_the_contract_and_learn(tmp_path, cache):
    run_dir = tmp_path / "run"
    result = subprocess.run(
        niced([sys.executable, "-m", "training", "train", "--synthetic", "--steps", "200",
               "--out", str(run_dir)]), cwd=ROOT, capture_output=True, text=True, timeout=1100,
        # One thread: tiny matmuls gain nothing from more, and lose a lot on a shared box.
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    events = read_events(run_dir)
    for event in events:
        check_event(event, ttt_steps=3)
    kinds = [e["event"] for e in events]
    assert kinds[0] == "start" and kinds[-1] == "end" and events[-1]["status"] == "completed"
    assert kinds.count("checkpoint") == 1
    steps = [e for e in events if e["event"] == "step"]
    assert [e["step"] for e in steps] == list(range(1, 201))
    first = sum(e["loss"] for e in steps[:20]) / 20
    last = sum(e["loss"] for e in steps[-20:]) / 20
    assert last <= 0.7 * first, (first, last)
    # One human-readable key=value line per step for the tmux pane.
    step_lines = [line for line in result.stdout.splitlines() if line.startswith("step=")]
    assert len(step_lines) == 200 and "loss=" in step_lines[-1]


def test_the_writer_refuses_events_off_the_contract(tmp_path):
    writer = MetricsWriter(tmp_path / "metrics.jsonl")
    with pytest.raises(ValueError, match="checkpoint"):
        writer.write("checkpoint", step=3)
    writer.write("end", status="completed")
    MetricsWriter(None).write("end", status="completed")  # ranks other than 0: nothing
    assert [e["event"] for e in read_events(tmp_path)] == ["end"]


def test_the_oom_event_reads_the_failed_allocation():
    error = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 512.00 MiB. GPU 0")
    assert _tried_gib(error) == 0.5
    assert _tried_gib(torch.OutOfMemoryError("out of memory")) is None


@pytest.mark.parametrize("message,tried", [
    ("CUDA out of memory. Tried to allocate 64.00 MiB. GPU 0 has a total capacity", 0.0625),
    ("out of memory", None)])
def test_an_oom_ends_the_run_with_its_params_and_exit_3(tmp_path, capsys, message, tried):
    """What train() does with any torch.OutOfMemoryError, however far it got (the GPU test
    below raises real ones while placing the model and in a step)."""
    cfg = TrainConfig(data=tmp_path, run_dir=tmp_path, drafter=PRESETS["tiny"],
                      max_seq_len=4096, ttt_steps=5)
    metrics = MetricsWriter(tmp_path / "metrics.jsonl")
    assert record_oom(metrics, cfg, torch.device("cpu"),
                      torch.OutOfMemoryError(message)) == EXIT_OOM == 3
    oom, end = read_events(tmp_path)
    for event in (oom, end):
        check_event(event, ttt_steps=5)
    assert oom == {**oom, "event": "oom", "max_seq_len": 4096, "ttt_steps": 5,
                   "tried_gib": tried}
    assert oom["peak_mem_gib"] > 0  # this process's peak resident set on CPU
    assert end == {**end, "event": "end", "status": "oom"}
    err = capsys.readouterr().err
    assert "max_seq_len=4096 ttt_steps=5" in err and message in err


def test_the_loader_resumes_and_splits_global_batches_over_ranks(cache):
    data = Dataset(synthetic_dataset(0))
    whole = Loader(data, 512, 4, seed=3)
    first = whole.iterate(Position())
    batches = [next(first) for _ in range(whole.steps_per_epoch + 2)]
    first.close()
    assert batches[-1][1] == 1  # into the second epoch
    # From a saved position the loader goes on with exactly what came next.
    again = whole.iterate(batches[4][2])
    assert torch.equal(next(again)[0].input_ids, batches[5][0].input_ids)
    again.close()
    # Two ranks of 2 rows see together the 4 rows of one process, in order.
    for b in range(3):
        parts = []
        for rank in range(2):
            it = Loader(data, 512, 2, seed=3, rank=rank, world_size=2).iterate(Position(0, b))
            parts.append(next(it)[0].input_ids)
            it.close()
        assert torch.equal(torch.cat(parts), batches[b][0].input_ids)



@pytest.mark.gpu
def test_the_loader_collates_into_pinned_memory_for_a_cuda_device(cache):
    # Pageable batches cost the loop 20 % of a llama3-8b 8192 × 5 step (docs/benchmarks.md,
    # "Pinned batches in the training loop"): the device copy of pinned ones is fast and does not block the CPU.
    data = Dataset(synthetic_dataset(0))
    batches = []
    for pin in (True, False):
        it = Loader(data, 512, 2, seed=3, pin_memory=pin).iterate(Position())
        batches.append(next(it)[0])
        it.close()
    pinned, pageable = batches
    tensors = ("input_ids", "position_ids", "doc_ids", "loss_mask", "aux_hidden",
               "final_hidden")
    assert all(getattr(pinned, name).is_pinned() for name in tensors)
    assert not any(getattr(pageable, name).is_pinned() for name in tensors)
    on_gpu = pinned.to("cuda", non_blocking=True)
    for name in tensors:
        assert torch.equal(getattr(on_gpu, name).cpu(), getattr(pageable, name))

def test_export_writes_the_eagle3_layout(tmp_path, cache):
    cfg = TrainConfig(data=synthetic_dataset(0), run_dir=tmp_path / "run",
                      drafter=PRESETS["tiny"], steps=2, max_seq_len=256,
                      export=tmp_path / "export")
    assert train(cfg) == 0
    out = tmp_path / "export"
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["num_hidden_layers"] == 1 and config["draft_vocab_size"] == 256
    assert config["vocab_size"] == 512 and config["norm_before_residual"] is False
    assert "eagle_aux_hidden_state_layer_ids" not in config  # the default layers
    weights = load_file(out / "model.safetensors")
    assert weights["fc.weight"].shape == (64, 192)
    assert weights["midlayer.self_attn.q_proj.weight"].shape == (64, 128)
    assert weights["lm_head.weight"].shape == (256, 64)
    assert weights["lm_head.weight"].dtype == torch.bfloat16
    # Offset convention: target id = draft index + d2t; t2d marks exactly those targets.
    targets = torch.arange(256) + weights["d2t"]
    assert torch.equal(weights["t2d"].nonzero().flatten(), targets)
    saved = load_file(latest(tmp_path / "run" / "checkpoints") / "model.safetensors")
    assert torch.equal(saved["fc.weight"].to(torch.bfloat16), weights["fc.weight"])
    assert export_drafter(latest(tmp_path / "run" / "checkpoints"), tmp_path / "e2") \
        == tmp_path / "e2"


def test_a_frozen_draft_head_stays_the_verifiers_and_is_exported(tmp_path, cache):
    data = synthetic_dataset(0)
    cfg = TrainConfig(data=data, run_dir=tmp_path / "run", drafter=PRESETS["tiny"], steps=3,
                      max_seq_len=256, freeze_lm_head=True, save_every=2,
                      export=tmp_path / "export")
    assert train(cfg) == 0
    start = read_events(cfg.run_dir)[0]
    assert start["config"]["freeze_lm_head"] is True
    saved = load_file(latest(cfg.run_dir / "checkpoints") / "model.safetensors")
    # the verifier's head on the draft vocabulary, unchanged by three steps
    head = Dataset(data).verifier()["lm_head"][saved["d2t"]]
    assert torch.equal(saved["lm_head.weight"], head)
    exported = load_file(tmp_path / "export" / "model.safetensors")
    assert torch.equal(exported["lm_head.weight"], head.to(torch.bfloat16))
    # the rest still trains: the layer moved between the checkpoints of steps 2 and 3
    before = load_file(cfg.run_dir / "checkpoints" / "step-2" / "model.safetensors")
    assert not torch.equal(before["fc.weight"], saved["fc.weight"])
    resumed = TrainConfig(data=data, run_dir=cfg.run_dir, drafter=PRESETS["tiny"], steps=4,
                          max_seq_len=256, resume=True)
    with pytest.raises(ValueError, match="--freeze-lm-head"):
        train(resumed)


EXPANDABLE = """
import torch  # first, as the trainer imports it: the setting still counts after the import
from training.device import use_cuda_allocator_settings
torch.cuda.is_available()  # as the command line asks before train() sets it
use_cuda_allocator_settings()
x = torch.ones(2**20, device="cuda")
print(all(s["is_expandable"] for s in torch.cuda.memory_snapshot()))
"""


@pytest.mark.gpu
@pytest.mark.parametrize("user_conf", [None, "expandable_segments:False"])
def test_the_trainer_allocates_from_expandable_segments_unless_the_user_says(user_conf):
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_CUDA_ALLOC_CONF"}
    if user_conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = user_conf
    result = subprocess.run([sys.executable, "-c", EXPANDABLE], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False" if user_conf else "True"]


@pytest.mark.gpu
@pytest.mark.parametrize("where", ["placing the model", "in a step"])
def test_cuda_oom_is_an_event_and_exit_3(tmp_path, cache, where):
    # The cap is 20 MiB. Placing the model: the tiny drafter with an MLP of 2**18 channels,
    # each of whose 3 weights is 64 MiB. In a step: one 65536-token row of aux hidden
    # states alone is 48 MiB.
    if where == "placing the model":
        wide = {**PRESETS["tiny"].to_dict(), "intermediate_size": 2**18}
        (tmp_path / "wide.json").write_text(json.dumps(wide))
        args = ["--model-config", str(tmp_path / "wide.json"), "--max-seq-len", "256"]
        max_seq_len = 256
    else:
        args, max_seq_len = ["--max-seq-len", "65536"], 65536
    result = subprocess.run(
        [sys.executable, "-m", "training", "train", "--synthetic", "--steps", "2",
         "--device", "cuda", "--gpu-mem-gib", "0.02", *args, "--out", str(tmp_path / "run")],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 3, result.stderr
    assert "Traceback" not in result.stderr and "CUDA out of memory" in result.stderr
    events = read_events(tmp_path / "run")
    for event in events:
        check_event(event, ttt_steps=3)
    oom, end = events[-2:]
    assert oom["event"] == "oom" and oom["max_seq_len"] == max_seq_len
    assert oom["ttt_steps"] == 3 and oom["peak_mem_gib"] is not None
    assert end == {**end, "event": "end", "status": "oom"}
    if where == "placing the model":
        assert [e["event"] for e in events] == ["oom", "end"]  # before `start`: no step ran
        assert oom["tried_gib"] == pytest.approx(64 / 1024)
