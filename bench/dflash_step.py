"""DFlash training step: trackside's against speculators 0.9.0's, and the story's
configuration under a memory cap against the memory model.

Each measurement runs in a child process of its own (a clean allocator and compile
state), on identical inputs: one packed row of max_seq_len tokens holding samples of
1,536-2,560 tokens (the first eighth of each without loss, as a prompt), random hidden
states of the verifier's five context layers and its final layer, random frozen
embedding and head; trackside's row also carries the verifier's argmax at each position,
made once before the steps as `trackside extract` keeps it from the verifier's forward
(`--tokens-in-step` adds a child that makes them in each step from the final hidden
states, as speculators does and as trackside does for data extracted without them). A
child reports the wall time of its set-up (random inputs, the model) and of its first
step (compilation included), the median of its timed steps, tokens/s (row tokens per second) and
torch.cuda.max_memory_allocated over the timed steps; trackside's children also the
memory model's prediction for the step (training/drafters/dflash/memory.py).

speculators is the anchor: its DFlashDraftModel built from a Qwen3 layer config, as its
trainer builds it for `--speculator-type dflash` (its defaults: five layers, block 16,
512 anchors, cross-entropy against the verifier's argmax through its fused Triton loss,
compiled forward, flex_attention with its compiled block mask), here with trackside's
exponential position weights (gamma 7) so that both optimise the same loss, stepped as
its Trainer steps (bf16 autocast, clip 1.0, torch.optim.AdamW). It is imported from an
installed package, never copied here.

    python bench/dflash_step.py                      # H200: Qwen3-8B shape, both trainers
    python bench/dflash_step.py --new-shape          # + trackside's first step at a 2nd shape
    python bench/dflash_step.py --story --gpu-mem-gib 95   # story config, + unchunked loss
    python bench/dflash_step.py --export-check DIR --data DATA   # speculators loads DIR
    python bench/dflash_step.py --smoke              # CPU: tiny shapes, every code path

With OUT set, also writes $OUT/dflash_step.json after every child.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from bench.random_data import prompt_len  # noqa: E402
from bench.train_step import (profile_steps, sample_lengths,  # noqa: E402
                              speculators_loss_implementation, marks_lines, timeline)
from training.config import DFLASH_PRESETS, DFLASH_TRAINING_PRESETS  # noqa: E402
from training.memory.measured import unmodelled_fp8  # noqa: E402
from training.params import PARAMS  # noqa: E402

GAMMA = PARAMS["dflash_gamma"].default  # both trainers at the trainer's default
LR = 1e-4
QWEN3 = {"preset": "qwen3-8b", "max_seq_len": 8192, "max_anchors": 512, "block_size": 16,
         "soft_kl": 0.0, "loss_chunk": 2048}
NEW_SHAPE = {**QWEN3, "max_seq_len": 6144, "max_anchors": 384}
STORY = {"preset": "story", "max_seq_len": 8192, "block_size": 24, "loss_chunk": 2048,
         **{k: DFLASH_TRAINING_PRESETS["story"][k] for k in ("max_anchors", "soft_kl")}}
TINY = {"preset": "tiny", "max_seq_len": 256, "max_anchors": 16, "block_size": 8,
        "soft_kl": 0.0, "loss_chunk": 64}


def drafter_config(spec: dict):
    return dataclasses.replace(DFLASH_PRESETS[spec["preset"]], block_size=spec["block_size"])


def packed_row(spec: dict, device: torch.device, dtype: torch.dtype) -> dict:
    cfg = drafter_config(spec)
    L, H = spec["max_seq_len"], cfg.hidden_size
    span = (1536, 2560) if L >= 4096 else (48, 160)
    lengths = sample_lengths(L, 0, span)
    g = torch.Generator().manual_seed(1)
    doc = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    # the data never holds the mask token (training/config.py)
    ids = torch.randint(cfg.mask_token_id, (1, L), generator=g)
    return {
        "input_ids": ids.to(device), "doc_ids": doc[None].to(device),
        "position_ids": torch.cat([torch.arange(n) for n in lengths])[None].to(device),
        "loss_mask": torch.cat([torch.arange(n) >= prompt_len(n) for n in lengths])[None]
        .to(device),
        "aux_hidden": torch.randn(1, L, cfg.num_target_layers * H, generator=g).to(device, dtype),
        "final_hidden": torch.randn(1, L, H, generator=g).to(device, dtype),
        "num_samples": len(lengths),
    }


def verifier_weights(spec: dict, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    cfg = drafter_config(spec)
    g = torch.Generator().manual_seed(2)
    return tuple((torch.randn(cfg.vocab_size, cfg.hidden_size, generator=g) * 0.02)
                 .to(device, torch.bfloat16) for _ in range(2))


def trackside_step(spec: dict, row: dict, device: torch.device):
    from training.drafters.dflash.loss import verifier_tokens
    from training.drafters.dflash.model import DFlashDrafter
    from training.drafters.dflash import step as run
    from training.nonfinite import Verdict
    from training.optimizer import make_optimizer, optimizer_step
    from training.packing import PackedBatch

    if spec.get("loss_pass") == "eager":  # the A/B against the Triton pass, and the story's
        from training.drafters.dflash import loss  # unfused softmaxes
        loss._chunk_pass = lambda hidden: loss._chunk
    cfg = drafter_config(spec)
    layers = list(range(cfg.num_target_layers))
    training = run.DFlashTraining(target_layers=tuple(layers), max_anchors=spec["max_anchors"],
                                  gamma=GAMMA, soft_kl=spec["soft_kl"])
    with torch.device(device):
        drafter = DFlashDrafter(cfg, spec.get("fp8", False))
    drafter.load_verifier(*verifier_weights(spec, device))
    model = run.DFlashStep(drafter, training, layers).to(device)
    params = [p for p in drafter.parameters() if p.requires_grad]
    optimizer = make_optimizer(params, LR, device)
    batch = PackedBatch(row["input_ids"], row["position_ids"], row["doc_ids"], row["loss_mask"],
                        row["aux_hidden"], row["final_hidden"], num_samples=row["num_samples"],
                        num_truncated=0, pad_tokens=0)
    if not spec.get("tokens_in_step"):  # the verifier's argmax, as `trackside extract` keeps it
        L = spec["max_seq_len"]
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        batch.verifier_ids = verifier_tokens(
            row["final_hidden"].flatten(0, 1),
            torch.unique(torch.arange(L, device=device), return_inverse=True), drafter.lm_head,
            dtype, spec["loss_chunk"]).view(1, L)
    host = batch.to("cpu")  # as the trainer's loader makes it: the step's plan is drawn there

    def step(mark=lambda name: None) -> float:
        """As the trainer steps (training/loop.py): the loss is read with the verdict on
        the step's gradient, before the optimizer is queued, and nothing after it."""
        per_offset, counts = run.forward_backward(model, batch, cfg, training,
                                                  spec["loss_chunk"], host=host)
        mark("backward")
        verdict = Verdict(per_offset, 1)
        optimizer_step(optimizer, params, 1.0, apply=verdict)
        mark("optimizer")
        return sum(verdict.sums[:len(per_offset)]) / max(sum(counts), 1)
    step.marked = {f"layer {i}": layer for i, layer in enumerate(drafter.layers)}
    step.marked["forward"] = model
    return step


def speculators_step(spec: dict, row: dict, device: torch.device):
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.losses import resolve_loss_config
    from speculators.models.dflash import DFlashDraftModel, DFlashSpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import Qwen3Config

    cfg = drafter_config(spec)
    implementation = speculators_loss_implementation(device)
    layer = Qwen3Config(
        hidden_size=cfg.hidden_size, num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
        intermediate_size=cfg.intermediate_size, vocab_size=cfg.vocab_size,
        num_hidden_layers=cfg.num_layers, rms_norm_eps=cfg.rms_norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        max_position_embeddings=max(40960, 2 * spec["max_seq_len"]))
    if device.type != "cuda":
        layer._attn_implementation = "eager"  # flex_attention has no CPU backward
    config = DFlashSpeculatorConfig(
        transformer_layer_config=layer, draft_vocab_size=cfg.vocab_size,
        block_size=cfg.block_size, aux_hidden_state_layer_ids=list(range(cfg.num_target_layers)),
        mask_token_id=cfg.mask_token_id,
        speculators_config=SpeculatorsConfig(
            algorithm="dflash", default_proposal_method="greedy",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=cfg.block_size - 1)],
            verifier=VerifierConfig(name_or_path=None, architectures=[])))
    torch.manual_seed(0)
    model = DFlashDraftModel(config)
    embed, head = verifier_weights(spec, torch.device("cpu"))
    with torch.no_grad():  # NaN until a verifier is loaded; frozen, as its trainer keeps them
        model.embed_tokens.weight.copy_(embed)
        model.lm_head.weight.copy_(head)
        model.verifier_lm_head.weight.copy_(head)
    model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    kwargs = dict(hidden_states=row["aux_hidden"], input_ids=row["input_ids"],
                  loss_mask=row["loss_mask"], verifier_last_hidden_states=row["final_hidden"],
                  document_ids=row["doc_ids"], position_ids=row["position_ids"],
                  loss_config=resolve_loss_config("ce", implementation), gamma=GAMMA,
                  max_anchors=spec["max_anchors"],
                  per_position_loss_weight="fixed-exp-decay")

    def step() -> float:
        """Its loss read where trackside's step reads its own: after backward, before the
        optimizer (whose GPU time then overlaps the next step's queueing, for both)."""
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            _, loss, _ = model(**kwargs)
        optimizer.zero_grad()
        loss.backward()
        value = float(loss.detach())
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return value
    return step


def predicted_gib(spec: dict, precision: str) -> float:
    from training.drafters.dflash import memory
    from training.memory.units import GiB

    shape = memory.DFlashShape(spec["max_seq_len"], spec["max_anchors"], spec["soft_kl"],
                               loss_chunk=spec["loss_chunk"], precision=precision)
    return memory.predict(drafter_config(spec), shape).total / GiB


def child(spec: dict) -> dict:
    from training.device import use_cuda_allocator_settings

    trainer = spec["trainer"]
    if trainer == "trackside":  # speculators runs under the allocator it is given
        use_cuda_allocator_settings()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    result = {**spec, "tokens": spec["max_seq_len"],
              "positions": spec["max_anchors"] * spec["block_size"]}
    if trainer == "trackside" and not unmodelled_fp8(spec):
        result["predicted_gib"] = predicted_gib(spec, "bf16" if device.type == "cuda" else "fp32")
    if spec.get("cap_gib") and device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, spec["cap_gib"] * 2**30 / total))
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    torch.manual_seed(0)
    started = time.perf_counter()
    try:
        row = packed_row(spec, device, dtype)
        make = trackside_step if trainer == "trackside" else speculators_step
        step = make(spec, row, device)
        sync()
        stepping = time.perf_counter()
        result["setup_s"] = stepping - started
        first = step()
        sync()
        result["first_step_s"] = time.perf_counter() - stepping
        for _ in range(spec["warmup"]):
            step()
        sync()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        times, losses = [], []
        for _ in range(spec["steps"]):
            t0 = time.perf_counter()
            losses.append(step())  # reads the step's loss (each trainer where its own does)
            times.append(time.perf_counter() - t0)
        if spec.get("timeline") and trainer == "trackside":
            result["marks"] = timeline(step, spec["steps"])
        if spec.get("profile"):
            profile_steps(step, spec["profile"])
    except torch.OutOfMemoryError as e:
        result.update(oom=True, error=str(e).splitlines()[0],
                      peak_gib=(torch.cuda.max_memory_allocated() / 2**30
                                if device.type == "cuda" else None))
        return result
    result.update(
        step_s=statistics.median(times), step_s_each=[round(t, 5) for t in times],
        tokens_per_s=spec["max_seq_len"] / statistics.median(times),
        peak_gib=(torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None),
        reserved_gib=(torch.cuda.max_memory_reserved() / 2**30 if device.type == "cuda"
                      else None),
        loss_first=first, loss_last=losses[-1])
    return result


def run_child(spec: dict, timeout: float) -> dict:
    # -X faulthandler: a child past its time is sent SIGABRT and prints every thread's
    # stack, so a timeout says where the child was (compiling, autotuning, stepping).
    cmd = [sys.executable, "-X", "faulthandler", __file__, "--child", json.dumps(spec)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        try:
            _, stderr = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, stderr = proc.communicate()
        return {**spec, "error": f"timeout {timeout:g} s", "stack": stderr[-6000:]}
    if spec.get("profile") and os.environ.get("OUT"):
        Path(os.environ["OUT"], f"profile-{label(spec)}.txt").write_text(stderr)
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    tail = (stderr.strip().splitlines() or ["no output"])[-1]
    return {**spec, "error": f"exit {proc.returncode}: {tail}"}


def label(spec: dict) -> str:
    loss_pass = "-eager" if spec.get("loss_pass") == "eager" else ""
    loss_pass += "-tokens-in-step" if spec.get("tokens_in_step") else ""
    loss_pass += "-fp8" if spec.get("fp8") else ""
    return (f"{spec['trainer']}{loss_pass}-{spec['preset']}-{spec['max_seq_len']}-"
            f"{spec['max_anchors']}-{spec['loss_chunk']}")


def describe(r: dict) -> str:
    loss_pass = " eager loss" if r.get("loss_pass") == "eager" else ""
    loss_pass += " tokens in step" if r.get("tokens_in_step") else ""
    loss_pass += " fp8" if r.get("fp8") else ""
    head = (f"{r['trainer']:11s} {r['preset']} L {r['max_seq_len']} anchors "
            f"{r['max_anchors']} block {r['block_size']} soft KL {r['soft_kl']:g} chunk "
            f"{r['loss_chunk']}{loss_pass}" + (f" cap {r['cap_gib']:g} GiB" if r.get("cap_gib") else ""))
    predicted = (f", predicted {r['predicted_gib']:.2f} GiB" if "predicted_gib" in r else "")
    if r.get("oom"):
        peak = f" (peak {r['peak_gib']:.2f} GiB)" if r.get("peak_gib") else ""
        return f"{head}: OOM{peak}{predicted}: {r['error'][:120]}"
    if "error" in r:
        return f"{head}: error: {r['error'][:160]}"
    peak = f", peak {r['peak_gib']:.2f} GiB" if r.get("peak_gib") is not None else ""
    if r.get("peak_gib") and "predicted_gib" in r:
        predicted += f" ({r['predicted_gib'] / r['peak_gib'] - 1:+.1%})"
    return (f"{head}: {r['tokens_per_s']:,.0f} tokens/s (median step {r['step_s'] * 1e3:.0f} "
            f"ms), first step {r['first_step_s']:.1f} s (set-up {r['setup_s']:.1f} s)"
            f"{peak}{predicted}, loss "
            f"{r['loss_first']:.3f} -> {r['loss_last']:.3f}" + marks_lines(r))


def export_check(export: Path, data: Path) -> dict:
    """speculators loads the export on this device, runs its forward with its loss, and
    drafts the same hidden states as trackside's drafter with the same weights and
    anchors."""
    from safetensors.torch import load_file
    from speculators.losses import resolve_loss_config
    from speculators.models.dflash import DFlashDraftModel, DFlashSpeculatorConfig
    from speculators.models.dflash import core

    from training.config import DFlashConfig
    from training.data import Dataset
    from training.drafters.dflash.model import DFlashDrafter
    from training.packing import PackedBatch

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    config = DFlashSpeculatorConfig.from_pretrained(export)
    if device.type != "cuda":
        config.transformer_layer_config._attn_implementation = "eager"
    model = DFlashDraftModel.from_pretrained(export, config=config).float().to(device).eval()
    verifier = load_file(data / "verifier.safetensors")
    with torch.no_grad():  # a server shares the verifier's; no verifier to load here
        model.embed_tokens.weight.copy_(verifier["embed_tokens"])
        model.lm_head.weight.copy_(verifier["lm_head"])
        model.verifier_lm_head.weight.copy_(verifier["lm_head"])
    dataset = Dataset(data)
    samples = [dataset[i] for i in range(4)]
    L = sum(int(s["input_ids"].shape[0]) for s in samples)
    ids = torch.cat([s["input_ids"] for s in samples])[None].to(device)
    doc = torch.repeat_interleave(torch.arange(4), torch.tensor([s["input_ids"].shape[0]
                                                                 for s in samples]))[None]
    pos = torch.cat([torch.arange(s["input_ids"].shape[0]) for s in samples])[None]
    mask = torch.cat([s["loss_mask"] for s in samples])[None].to(device)
    aux = torch.cat([s["aux_hidden"] for s in samples])[None].to(device, torch.float32)
    final = torch.cat([s["final_hidden"] for s in samples])[None].to(device, torch.float32)
    doc, pos = doc.to(device), pos.to(device)
    # speculators' own forward: its anchors, compiled mask and loss
    with torch.no_grad(), torch.autocast(device.type, torch.bfloat16,
                                         enabled=device.type == "cuda"):
        _, loss, metrics = model(hidden_states=aux, input_ids=ids, loss_mask=mask,
                                 verifier_last_hidden_states=final, document_ids=doc,
                                 position_ids=pos, max_anchors=8, gamma=GAMMA,
                                 loss_config=resolve_loss_config(
                                     "ce", "fused" if device.type == "cuda" else "eager"))
    # the same anchors through both drafters, float32
    block = config.block_size
    anchors = (torch.arange(4, device=device) * (L // 4) + 1)[None]
    core_select = core.select_anchors
    core.select_anchors = lambda *a, **k: (anchors[0], torch.ones(4, dtype=torch.bool,
                                                                  device=device))
    try:
        with torch.no_grad():
            theirs, *_ = model._backbone_forward(aux, ids, mask.float(), final, doc,
                                                         pos, max_anchors=4)
    finally:
        core.select_anchors = core_select
    saved = json.loads((export / "config.json").read_text())["transformer_layer_config"]
    ours_cfg = DFlashConfig(
        hidden_size=saved["hidden_size"], num_heads=saved["num_attention_heads"],
        num_kv_heads=saved["num_key_value_heads"], head_dim=saved["head_dim"],
        intermediate_size=saved["intermediate_size"], vocab_size=saved["vocab_size"],
        num_layers=saved["num_hidden_layers"],
        num_target_layers=len(config.aux_hidden_state_layer_ids), block_size=block,
        mask_token_id=config.mask_token_id, rms_norm_eps=saved["rms_norm_eps"],
        rope_theta=saved["rope_parameters"]["rope_theta"])
    with torch.device(device):
        ours = DFlashDrafter(ours_cfg)
    ours.load_state_dict({n: t.float() for n, t in load_file(export / "model.safetensors")
                          .items()}, strict=False)
    ours.load_verifier(verifier["embed_tokens"].float(), verifier["lm_head"].float())
    kept = {}
    ours.norm.register_forward_hook(lambda m, i, o: kept.setdefault("h", o))
    import training.drafters.dflash.model as model_module
    own = model_module.sample_anchors
    model_module.sample_anchors = lambda *a, **k: (anchors, torch.ones(1, 4, dtype=torch.bool,
                                                                       device=device))
    try:
        with torch.no_grad():
            ours(PackedBatch(ids, pos, doc, mask, aux, final, num_samples=4, num_truncated=0,
                             pad_tokens=0), aux, 4, GAMMA)
    finally:
        model_module.sample_anchors = own
    rows = torch.arange(4 * block, device=device).view(4, block)[:, 1:]
    scored = mask[0, (anchors[0, :, None] + torch.arange(block, device=device))[:, 1:]
                  .clamp(max=L - 1)]
    diff = (kept["h"] - theirs[0, rows[scored]]).abs().max().item()
    return {"export": str(export), "device": device.type, "loss": float(loss),
            "full_acc": float(metrics["full_acc_sum"] / metrics["full_acc_total"]),
            "hidden_max_abs_diff": diff, "positions_compared": int(scored.sum())}


def against_speculators(results: list[dict], max_seq_len: int) -> list[str]:
    """Each trackside child's tokens/s (and peak) over speculators', from the first
    measurement of each at max_seq_len: as extracted, and with the verifier's tokens made
    in the step, speculators' own work, each on a line of its own."""
    first: dict[str, dict] = {}
    for r in results:
        if "tokens_per_s" in r and not r.get("loss_pass") and r["max_seq_len"] == max_seq_len:
            first.setdefault(r["trainer"] + (", tokens in the step" if r.get("tokens_in_step") else ""), r)
    s = first.pop("speculators", None)
    if s is None:
        return []
    return [f"{name} / speculators: {t['tokens_per_s'] / s['tokens_per_s']:.2f}× tokens/s"
            + (f", peak {t['peak_gib'] / s['peak_gib']:.2f}× speculators'"
               if t.get("peak_gib") and s.get("peak_gib") else "")
            for name, t in first.items()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trainers", nargs="+", default=["trackside", "speculators"],
                   choices=["trackside", "speculators"])
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per child")
    p.add_argument("--new-shape", action="store_true",
                   help="then trackside's first step at another shape")
    p.add_argument("--story", action="store_true",
                   help="the story's configuration (and its unchunked loss) instead")
    p.add_argument("--gpu-mem-gib", type=float, default=0,
                   help="cap each child's CUDA allocations (the story's card: 95)")
    p.add_argument("--export-check", type=Path, metavar="DIR")
    p.add_argument("--data", type=Path, help="with --export-check: the run's data")
    p.add_argument("--eager-loss", action="store_true",
                   help="also trackside with the eager loss pass (CUDA runs Triton's)")
    p.add_argument("--tokens-in-step", action="store_true",
                   help="also trackside making the verifier's tokens in each step")
    p.add_argument("--fp8", action="store_true",
                   help="trackside with the layers' projections in fp8 (train --fp8)")
    p.add_argument("--profile", type=int, default=0, metavar="ROWS",
                   help="profile two steps of each child: $OUT/profile-*.txt")
    p.add_argument("--timeline", action="store_true",
                   help="trackside's children also report where the CPU and the GPU are "
                        "at points of a step (each layer's forward, backward, optimizer)")
    p.add_argument("--smoke", action="store_true", help="CPU: tiny shapes, every mode")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))), flush=True)
        return 0
    if args.export_check:
        result = export_check(args.export_check, args.data)
        print(json.dumps(result), flush=True)
        if os.environ.get("OUT"):
            Path(os.environ["OUT"], "dflash_export_check.json").write_text(json.dumps(result))
        return 0
    if args.smoke:
        args.steps, args.warmup = 2, 1
    base = STORY if args.story else QWEN3
    if args.smoke:
        base = {**TINY, "soft_kl": base["soft_kl"]}
    common = {"steps": args.steps, "warmup": args.warmup, "cap_gib": args.gpu_mem_gib,
              "profile": args.profile, "timeline": args.timeline}
    specs = [{**base, **common, "trainer": t} for t in args.trainers]
    if args.eager_loss and not args.story:
        specs.insert(1, {**base, **common, "trainer": "trackside", "loss_pass": "eager"})
    if args.tokens_in_step and not args.story:
        specs.insert(1, {**base, **common, "trainer": "trackside", "tokens_in_step": True})
    if args.story:
        positions = base["max_anchors"] * (base["block_size"] - 1)
        whole = {**base, **common, "trainer": "trackside", "loss_chunk": positions,
                 "steps": 1, "warmup": 0}
        # unchunked: fused (what trackside runs), then eager (the story's whole softmaxes;
        # on the CPU the pass is the eager one already)
        specs = [{**base, **common, "trainer": "trackside"}, whole]
        if torch.cuda.is_available():
            specs.append({**whole, "loss_pass": "eager"})
    if args.new_shape:
        shape = {**TINY, "max_seq_len": 192, "max_anchors": 12} if args.smoke else NEW_SHAPE
        specs.append({**shape, **common, "trainer": "trackside"})
    for spec in specs:
        spec["fp8"] = args.fp8 and spec["trainer"] == "trackside"
    gpu = torch.cuda.is_available()
    results = []
    report = {"command": " ".join([Path(sys.executable).name, *sys.argv]),
              "device": torch.cuda.get_device_name() if gpu else "cpu",
              "torch": torch.__version__, "results": results}
    for spec in specs:
        result = run_child(spec, args.timeout)
        results.append(result)
        if os.environ.get("OUT"):  # after every child: a run cut short keeps what it did
            Path(os.environ["OUT"], "dflash_step.json").write_text(json.dumps(report, indent=1))
        print(describe(result), flush=True)
    for line in [] if args.story else against_speculators(results, base["max_seq_len"]):
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
