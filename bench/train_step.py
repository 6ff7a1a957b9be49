"""Training-step throughput and memory: trackside's trainer against speculators (vLLM's).

For each cell (drafter shape, max_seq_len, TTT steps) and each repeat, one child process
per trainer runs a full training step (forward over all TTT steps, backward, grad clip,
AdamW) on identical packed inputs: one row of max_seq_len tokens holding samples of
~2K tokens (1,536-2,560), as the trainers pack them. The trainers alternate (A B, then
B A) so drift of the card's clocks or temperature does not favour one. Each child reports
its first step's wall time (compilation included), the median of --steps timed steps
after --warmup, tokens/s, and torch.cuda.max_memory_allocated (and _reserved, in the
JSON) over the timed steps.

MFU counts each trainer's useful FLOPs (model_flops below: without the draft head's weight
gradient for the trainers that freeze it) over the median step time, against a bf16 matmul ceiling measured by the parent at the start and the end
of the run (8192³ products, the median of many, on random data).

speculators is the anchor: its Eagle3DraftModel (compiled forward, flex_attention with a
BlockMask extended per TTT step, fused Triton KL loss) built from a Llama layer config,
its verifier head filled with random weights, stepped as its Trainer does (bf16 autocast,
clip 1.0, torch.optim.AdamW). It keeps its draft head (lm_head) frozen at the verifier's
weights, trackside trains it unless --freeze-lm-head: speculators skips that weight
gradient (one head-sized matmul per TTT step); trackside+frozen (--freeze-lm-head) does
the same work as speculators. It is imported from an installed package, never copied
here.

    python bench/train_step.py                          # H200: the llama3-8b table, twice
    python bench/train_step.py --cells llama3-8b:8192:5 --trainers trackside
    python bench/train_step.py --smoke                  # CPU: tiny shapes, the code paths

With OUT set, also writes $OUT/train_step.json. A child that runs out of memory reports
OOM; one that fails otherwise reports its last error line; neither stops the table.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import torch.utils.checkpoint  # noqa: E402

from bench.random_data import prompt_len  # noqa: E402
from bench.timing import median_seconds  # noqa: E402
from training.config import PRESETS, DrafterConfig  # noqa: E402
from training.device import use_cuda_allocator_settings  # noqa: E402
from training.params import PARAMS  # noqa: E402

# trackside takes its options as suffixes, in this order: +frozen (--freeze-lm-head, its
# draft head kept at the verifier's as speculators keeps it: the same work as speculators,
# no weight gradient for the head), then +ckpt (--checkpoint-ttt: every TTT step
# recomputed in backward) or +ckptN (the first N steps), then +fp8 (--fp8: the MLP's
# matmuls in fp8). E.g. trackside+frozen+ckpt2, trackside+frozen+fp8.
TRAINER = re.compile(r"speculators|trackside(?P<frozen>\+frozen)?(?:\+ckpt(?P<ckpt>[0-9]*))?"
                     r"(?P<fp8>\+fp8)?")


def trainer_name(text: str) -> str:
    if not TRAINER.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text!r}: speculators, or trackside[+frozen][+ckpt[N]][+fp8]")
    return text


def trackside_options(name: str) -> tuple[int, bool, bool]:
    """(TTT steps recomputed, head frozen, fp8) of a trackside trainer name."""
    m = TRAINER.fullmatch(name)
    ckpt = m["ckpt"]
    return ((0 if ckpt is None else int(ckpt) if ckpt else sys.maxsize), bool(m["frozen"]),
            bool(m["fp8"]))


DEFAULT_CELLS = [f"llama3-8b:{L}:{K}" for L in (8192, 16384, 32768) for K in (3, 5, 7)]
SAMPLE_LEN = (1536, 2560)
TTT_DECAY = PARAMS["ttt_decay"].default
LR = 1e-4


@dataclass(frozen=True)
class Cell:
    preset: str
    max_seq_len: int
    ttt_steps: int

    @classmethod
    def parse(cls, text: str) -> Cell:
        try:
            preset, length, ttt = text.split(":")
            cell = cls(preset, int(length), int(ttt))
        except ValueError:
            raise SystemExit(f"bad cell {text!r}: want PRESET:MAX_SEQ_LEN:TTT") from None
        if preset not in PRESETS:
            raise SystemExit(f"bad cell {text!r}: unknown preset (known: {', '.join(PRESETS)})")
        return cell

    def __str__(self) -> str:
        return f"{self.preset}:{self.max_seq_len}:{self.ttt_steps}"


# --- inputs and FLOPs (shared by both trainers) ---------------------------------------------

def sample_lengths(max_seq_len: int, seed: int, span: tuple[int, int] = SAMPLE_LEN) -> list[int]:
    """Samples packed back to back into one row; the last one is cut to fill it."""
    g = torch.Generator().manual_seed(seed)
    lengths, total = [], 0
    while total < max_seq_len:
        n = int(torch.randint(span[0], span[1] + 1, (), generator=g))
        n = min(n, max_seq_len - total)
        lengths.append(n)
        total += n
    return lengths


def scored_positions(lengths: list[int], k: int) -> int:
    """Positions TTT step k scores: i whose target i + k + 1 lies in its sample and
    after the prompt."""
    return sum(max(0, n - max(prompt_len(n), k + 1)) for n in lengths)


def packed_inputs(cfg: DrafterConfig, max_seq_len: int, device: torch.device,
                  dtype: torch.dtype, seed: int = 0, span: tuple[int, int] = SAMPLE_LEN) -> dict:
    """One packed row [1, L]: token ids, per-sample positions and doc ids, a loss mask
    without each sample's first eighth (its prompt), random hidden states."""
    lengths = sample_lengths(max_seq_len, seed, span)
    g = torch.Generator().manual_seed(seed + 1)
    H, L = cfg.hidden_size, max_seq_len
    doc = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    pos = torch.cat([torch.arange(n) for n in lengths])
    mask = torch.cat([torch.arange(n) >= prompt_len(n) for n in lengths])
    return {
        "input_ids": torch.randint(cfg.vocab_size, (1, L), generator=g).to(device),
        "doc_ids": doc[None].to(device),
        "position_ids": pos[None].to(device),
        "loss_mask": mask[None].to(device),
        "aux_hidden": torch.randn(1, L, 3 * H, generator=g).to(device, dtype),
        "final_hidden": torch.randn(1, L, H, generator=g).to(device, dtype),
        "lengths": lengths,
    }


def model_flops(cfg: DrafterConfig, lengths: list[int], ttt_steps: int,
                head_grad: bool = True) -> float:
    """Useful FLOPs of one training step over one packed row: the work any EAGLE-3 trainer
    must do, whatever it recomputes or wastes.

    Per token: fc forward and weight gradient, the verifier's head on the draft vocabulary
    (forward only); per TTT step the layer's matmuls forward and both gradients (3×), and
    the draft head's on the positions the step scores (scored_positions: a head on a
    position without loss is work no trainer needs; 2× when the head is frozen,
    head_grad=False).
    Attention: document-causal pairs over step 0's keys plus the k diagonal keys of step
    k, QKᵀ and PV forward, ×3.5 with flash-style backward.
    """
    H, I, D = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    q, kv = cfg.num_heads * D, cfg.num_kv_heads * D
    T = sum(lengths)
    layer_macs = 2 * H * (q + 2 * kv) + q * H + 3 * H * I
    head_macs = H * cfg.draft_vocab_size
    flops = T * (2 * 2 * 3 * H * H + 2 * head_macs)
    flops += T * ttt_steps * 6 * layer_macs
    flops += sum(scored_positions(lengths, k) for k in range(ttt_steps)) \
        * (6 if head_grad else 4) * head_macs
    causal_pairs = sum(n * (n + 1) // 2 for n in lengths)
    for k in range(ttt_steps):
        flops += 3.5 * 4 * (causal_pairs + k * T) * q
    return float(flops)


def matmul_ceiling_tflops(n: int = 8192, reps: int = 50) -> float:
    """Median bf16 n×n×n product rate on this GPU, random operands (zeros run faster)."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    return 2 * n**3 / median_seconds(lambda: a @ b, reps, a.device, warmup=5) / 1e12


# --- the two trainers' steps -------------------------------------------------------------

def trackside_step(cfg: DrafterConfig, inputs: dict, ttt_steps: int, device: torch.device,
                   name: str):
    from training.drafters.eagle3.probe import Trainer
    from training.nonfinite import Verdict
    from training.packing import PackedBatch

    checkpoint_ttt, frozen, fp8 = trackside_options(name)
    trainer = Trainer(cfg, device, ttt_decay=TTT_DECAY, checkpoint_ttt=checkpoint_ttt,
                      freeze_lm_head=frozen, fp8=fp8)
    batch = PackedBatch(inputs["input_ids"], inputs["position_ids"], inputs["doc_ids"],
                        inputs["loss_mask"], inputs["aux_hidden"], inputs["final_hidden"],
                        num_samples=len(inputs["lengths"]), num_truncated=0, pad_tokens=0)

    host = batch.to("cpu")  # as the trainer's loader makes it: its positions are found there

    def step(mark=lambda name: None) -> float:
        """As the trainer steps (training/loop.py): the loss is read with the verdict on
        the step's gradient, before the optimizer is queued, and nothing after it."""
        per_step = trainer.forward_backward(batch, ttt_steps, 2048, host)
        mark("backward")
        verdict = Verdict(per_step, 1)
        trainer.optimizer_step(apply=verdict)
        mark("optimizer")
        return verdict.sums[0] / max(per_step[0].losses.shape[0], 1)
    step.marked = {"ttt step": trainer.drafter.midlayer, "forward": trainer.model}
    return step


def speculators_loss_implementation(device: torch.device) -> str:
    """Which of speculators' loss implementations to use on `device`: its fused Triton
    loss on CUDA, made compilable; eager elsewhere (Triton is CUDA only)."""
    if device.type != "cuda":
        return "eager"
    from speculators.losses import fused
    # speculators 0.9.0's two fused-loss kernels share one autotune config list, which
    # torch.compile on torch 2.11 rejects; a copy per kernel is the whole workaround.
    fused.loss_backward_kernel.configs = list(fused.loss_backward_kernel.configs)
    return "fused"


def speculators_step(cfg: DrafterConfig, inputs: dict, ttt_steps: int, device: torch.device):
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.losses import resolve_loss_config
    from speculators.models.eagle3 import Eagle3SpeculatorConfig
    from speculators.models.eagle3.core import Eagle3DraftModel
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import LlamaConfig

    implementation = speculators_loss_implementation(device)
    layer = LlamaConfig(
        hidden_size=cfg.hidden_size, num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
        intermediate_size=cfg.intermediate_size, vocab_size=cfg.vocab_size,
        num_hidden_layers=1, rms_norm_eps=cfg.rms_norm_eps, rope_theta=cfg.rope_theta,
        max_position_embeddings=max(131072, inputs["input_ids"].shape[1] + ttt_steps + 2))
    if device.type != "cuda":
        layer._attn_implementation = "eager"  # flex_attention has no CPU backward
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=layer, draft_vocab_size=cfg.draft_vocab_size,
        norm_before_residual=False,
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=ttt_steps)],
            default_proposal_method="greedy",
            verifier=VerifierConfig.from_config(layer, name_or_path=None)))
    model = Eagle3DraftModel(config)
    model.load_vocab_mappings(torch.ones(cfg.vocab_size, dtype=torch.bool)
                              .index_fill_(0, torch.arange(cfg.draft_vocab_size,
                                                           cfg.vocab_size), False),
                              torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
    with torch.no_grad():  # NaN until a verifier is loaded; frozen, as its trainer keeps them
        for weight in (model.verifier_lm_head.weight, model.lm_head.weight,
                       model.embed_tokens.weight):
            weight.normal_(std=0.02)
    model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    loss_config = resolve_loss_config("kl_div", implementation)
    # speculators' collate shifts by one: hidden state i pairs with token i + 1, and its
    # positions start at 1. Shapes and costs are what matter here.
    kwargs = dict(hidden_states=inputs["aux_hidden"], input_ids=inputs["input_ids"],
                  document_ids=inputs["doc_ids"], loss_mask=inputs["loss_mask"],
                  position_ids=inputs["position_ids"] + 1,
                  verifier_last_hidden_states=inputs["final_hidden"],
                  ttt_steps=ttt_steps, ttt_step_loss_decay=TTT_DECAY,
                  loss_config=loss_config)
    autocast = device.type == "cuda"

    def step() -> float:
        """Its loss read where trackside's step reads its own: after backward, before the
        optimizer (whose GPU time then overlaps the next step's queueing, for both)."""
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            _, loss, _ = model(**kwargs)
        optimizer.zero_grad()
        loss.backward()
        value = float(loss.detach())
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return value
    return step


def child(args: argparse.Namespace) -> dict:
    cell = Cell.parse(args.cell)
    cfg = PRESETS[cell.preset]
    if args.debug_checkpoint:  # a recomputation that differs from the forward names its ops
        torch.utils.checkpoint.set_checkpoint_debug_enabled(True)
    if args.trainer != "speculators":  # speculators runs under the allocator it is given
        use_cuda_allocator_settings()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)  # the same initial weights for every child of a trainer
    span = SAMPLE_LEN if cell.max_seq_len >= 4 * SAMPLE_LEN[1] else (64, 160)
    inputs = packed_inputs(cfg, cell.max_seq_len, device, dtype, span=span)
    result = {"trainer": args.trainer, "cell": str(cell), "tokens": cell.max_seq_len,
              "flops": model_flops(cfg, inputs["lengths"], cell.ttt_steps,
                                   head_grad=args.trainer != "speculators"
                                   and not trackside_options(args.trainer)[1])}
    if args.cap_gib and device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.cap_gib * 2**30 / total))
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    started = time.perf_counter()
    try:
        if args.trainer == "speculators":
            step = speculators_step(cfg, inputs, cell.ttt_steps, device)
        else:
            step = trackside_step(cfg, inputs, cell.ttt_steps, device, args.trainer)
        first_loss = step()
        sync()
        result["first_step_s"] = time.perf_counter() - started
        for _ in range(args.warmup):
            step()
        sync()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        times, losses = [], []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            losses.append(step())  # reads the step's loss (each trainer where its own does)
            times.append(time.perf_counter() - t0)
        if args.timeline and args.trainer != "speculators":
            result["marks"] = timeline(step, args.steps)
        if args.profile:
            profile_steps(step, args.profile)
    except torch.OutOfMemoryError as e:
        result.update(oom=True, error=str(e).splitlines()[0])
        return result
    result.update(
        step_s=statistics.median(times), step_s_each=[round(t, 5) for t in times],
        tokens_per_s=cell.max_seq_len / statistics.median(times),
        peak_gib=(torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda"
                  else None),
        # what the caching allocator held: the memory model's reserve (RESERVED_RATIO) is
        # fitted to such pairs
        reserved_gib=(torch.cuda.max_memory_reserved() / 2**30 if device.type == "cuda"
                      else None),
        loss_first=first_loss, loss_last=losses[-1],
        finite=all(math.isfinite(v) for v in [first_loss, *losses]))
    return result


def profile_steps(step, rows: int, steps: int = 2) -> None:
    """Print the kernels (or CPU ops) that took the most time over a few steps and, on a
    GPU, kernel_summary and idle_gaps of them; then idle_gaps of a few more steps traced
    with Python's frames, which name a stretch the CPU spent outside any op (a guard, a
    lock, the collector). Those run slower, so only their names are read from them."""
    from torch.profiler import ProfilerActivity, profile
    gpu = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
    key = "cuda_time_total" if gpu else "cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=rows, max_name_column_width=60),
          file=sys.stderr, flush=True)
    if not gpu:
        return
    kernels, host = trace_events(prof)
    print("\n".join(kernel_summary(kernels, steps) + idle_gaps(kernels, host)),
          file=sys.stderr, flush=True)
    try:  # a failure of this pass must not cost the child the figures it has
        with profile(activities=activities, with_stack=True) as prof:
            for _ in range(steps):
                step()
        kernels, host = trace_events(prof)
        lines = ["with Python's frames traced (slower):", *idle_gaps(kernels, host, 6)]
    except Exception as e:
        lines = [f"with Python's frames traced: failed, {type(e).__name__}: {e}"]
    print("\n".join(lines), file=sys.stderr, flush=True)


HOST_EVENTS = ("cpu_op", "cuda_runtime", "python_function")  # a trace's CPU-side categories


def trace_events(prof) -> tuple[list[dict], list[dict]]:
    """A profile's kernels and its host events (HOST_EVENTS), as its chrome trace has them."""
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp, "trace.json")
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text())["traceEvents"]
    timed = [e for e in events if "dur" in e]
    return ([e for e in timed if e.get("cat") == "kernel"],
            [e for e in timed if e.get("cat") in HOST_EVENTS])


def timeline(step, steps: int) -> list[dict]:
    """Where the CPU and the GPU are at points of a step (after each module of step.marked
    has run forward, its nth run in a step named "NAME #n"; after backward, after the
    optimizer: step(mark) marks those), in ms from its start, medians over `steps`: each
    step here starts with the GPU idle (waited for), so the GPU's lag behind the CPU at a
    point is the work queued ahead of it there. A lag near zero says the GPU waits on the
    CPU queueing its kernels; a growing one, that the CPU is ahead. On the CPU, its times
    alone (gpu_ms None)."""
    gpu = torch.cuda.is_available()
    marks: list[tuple[str, float, torch.cuda.Event | None]] = []

    def mark(name: str) -> None:
        event = torch.cuda.Event(enable_timing=True) if gpu else None
        if event is not None:
            event.record()
        runs = sum(1 for seen_name, *_ in marks if seen_name.split(" #")[0] == name)
        marks.append((f"{name} #{runs + 1}" if runs else name, time.perf_counter(), event))
    hooks = [module.register_forward_hook(lambda *_, name=name: mark(name))
             for name, module in step.marked.items()]
    seen: dict[str, list[tuple[float, float | None]]] = {}
    try:
        for _ in range(steps):
            if gpu:
                torch.cuda.synchronize()
            marks.clear()
            mark("start")
            step(mark)
            mark("end")
            if gpu:
                torch.cuda.synchronize()
            _, t0, e0 = marks[0]
            for name, t, event in marks[1:]:
                seen.setdefault(name, []).append(
                    ((t - t0) * 1e3, e0.elapsed_time(event) if gpu else None))
    finally:
        for hook in hooks:
            hook.remove()
    return [{"at": name, "cpu_ms": round(statistics.median(c for c, _ in times), 2),
             "gpu_ms": round(statistics.median(g for _, g in times), 2) if gpu else None}
            for name, times in seen.items()]


def kernel_kind(name: str) -> str:
    low = name.lower()
    if "flex" in low:
        return "flex attention"
    if any(mark in low for mark in ("nvjet", "gemm", "cutlass")):
        return "matmul"
    if low.startswith("_fold_"):  # training/fold_triton.py's kernels
        return "diagonal-key fold (triton)"
    if low.startswith(("_chunk_losses", "_block_loss")):  # the loss_triton.py kernels
        return "loss chunk (triton)"
    if low.startswith("triton"):
        return "compiled (triton)"
    return "eager: " + name.removeprefix("void ").split("<")[0].split("(")[0][:50]


def kernel_summary(kernels: list[dict], steps: int) -> list[str]:
    """Per step, from a profile's kernel events (chrome trace: ts, dur in µs): the time
    from the first kernel's start to the last one's end, how much of it some kernel ran
    (overlapping kernels count once) and the GPU idled, and kernel time by kind."""
    if not kernels:
        return ["no kernels recorded"]
    kernels = sorted(kernels, key=lambda e: e["ts"])
    busy, reached = 0.0, kernels[0]["ts"]
    for e in kernels:
        end = e["ts"] + e["dur"]
        busy += max(0.0, end - max(e["ts"], reached))
        reached = max(reached, end)
    span = reached - kernels[0]["ts"]
    by_kind: dict[str, float] = {}
    for e in kernels:
        kind = kernel_kind(e["name"])
        by_kind[kind] = by_kind.get(kind, 0.0) + e["dur"]
    total = sum(by_kind.values())
    lines = [f"per step: {span / steps / 1e3:.1f} ms from first kernel to last, "
             f"{busy / steps / 1e3:.1f} ms busy, {(span - busy) / steps / 1e3:.1f} ms idle"]
    lines += [f"  {t / steps / 1e3:8.2f} ms {100 * t / total:5.1f} %  {kind}"
              for kind, t in sorted(by_kind.items(), key=lambda kv: -kv[1])]
    return lines


def idle_gaps(kernels: list[dict], host: list[dict], count: int = 12) -> list[str]:
    """The longest stretches with no kernel running, where in the profile (ms from its
    first kernel), the kernels either side, the ops the CPU started meanwhile and the
    innermost host events (ops, CUDA calls, Python frames) that span most of it: the GPU
    waits there for the CPU to launch work, or for a sync, and those say which."""
    kernels = sorted(kernels, key=lambda e: e["ts"])
    gaps, reached, last = [], kernels[0]["ts"] if kernels else 0, None
    for e in kernels:
        if e["ts"] > reached:
            gaps.append((e["ts"] - reached, reached, last, e))
        if e["ts"] + e["dur"] >= reached:
            reached, last = e["ts"] + e["dur"], e
    idle = sum(g[0] for g in gaps) / 1e3
    lines = [f"longest idle stretches ({len(gaps)} in all, {idle:.1f} ms):"]
    for length, start, before, after in sorted(gaps, key=lambda g: -g[0])[:count]:
        started: dict[str, int] = {}
        for op in host:
            if op.get("cat") == "cpu_op" and start <= op["ts"] < start + length:
                started[op["name"]] = started.get(op["name"], 0) + 1
        busiest = ", ".join(f"{name} x{n}" for name, n in
                            sorted(started.items(), key=lambda kv: -kv[1])[:4])
        spanning = sorted((e for e in host if min(e["ts"] + e["dur"], start + length)
                           - max(e["ts"], start) >= length / 2), key=lambda e: e["dur"])
        inside = " < ".join(f"{e['name'][:50]} {e['dur'] / 1e3:.1f} ms" for e in spanning[:3])
        lines.append(f"  {length:8.0f} us at {(start - kernels[0]['ts']) / 1e3:7.1f} ms, after "
                     f"{before['name'][:40]} before {after['name'][:40]}; CPU: {busiest or '-'}"
                     + (f"; in: {inside}" if inside else ""))
    return lines


# --- the parent: cells × repeats × trainers, alternating -----------------------------------

def run_child(trainer: str, cell: Cell, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--child", "--trainer", trainer, "--cell", str(cell),
           "--steps", str(args.steps), "--warmup", str(args.warmup)]
    if args.cap_gib:
        cmd += ["--cap-gib", str(args.cap_gib)]
    if args.profile:
        cmd += ["--profile", str(args.profile)]
    if args.timeline:
        cmd += ["--timeline"]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout,
                              env=env)
    except subprocess.TimeoutExpired:
        return {"trainer": trainer, "cell": str(cell), "error": f"timeout {args.timeout} s"}
    if args.profile and os.environ.get("OUT"):  # the child prints its profile to stderr
        name = f"profile-{trainer}-{cell}.txt".replace(":", "-").replace("+", "-")
        Path(os.environ["OUT"], name).write_text(proc.stderr)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return {"trainer": trainer, "cell": str(cell), "error": f"exit {proc.returncode}: {tail}"}


def describe(r: dict, ceiling: float | None) -> str:
    if r.get("oom"):
        return "OOM"
    if "error" in r:
        return f"error: {r['error'][:90]}"
    mfu = (f" MFU {r['flops'] / r['step_s'] / 1e12 / ceiling:5.1%}" if ceiling else "")
    peak = f" {r['peak_gib']:6.2f} GiB" if r.get("peak_gib") is not None else ""
    return (f"{r['tokens_per_s']:9,.0f} tok/s {r['step_s'] * 1e3:8.1f} ms{peak}{mfu} "
            f"first {r['first_step_s']:5.1f} s loss {r['loss_first']:.3g}→{r['loss_last']:.3g}"
            + marks_lines(r))


def marks_lines(r: dict) -> str:
    """timeline's points of a result, a line each."""
    return "".join(f"\n  {m['at']:>12s}: CPU {m['cpu_ms']:7.2f} ms" + (
        f", GPU {m['gpu_ms']:7.2f} ms (lag {m['gpu_ms'] - m['cpu_ms']:+.2f})"
        if m["gpu_ms"] is not None else "") for m in r.get("marks", ()))


def summarise(results: list[dict], ceiling: float | None) -> list[str]:
    lines = ["", "| cell | trainer | tokens/s (each repeat) | peak GiB | MFU | first step s |",
             "| --- | --- | --- | --- | --- | --- |"]
    cells = list(dict.fromkeys(r["cell"] for r in results))
    for cell in cells:
        by_trainer = {}
        for trainer in dict.fromkeys(r["trainer"] for r in results):
            rs = [r for r in results if r["cell"] == cell and r["trainer"] == trainer]
            if not rs:
                continue
            ok = [r for r in rs if "tokens_per_s" in r]
            by_trainer[trainer] = ok
            tps = ", ".join("OOM" if r.get("oom") else f"{r['tokens_per_s']:,.0f}"
                            if "tokens_per_s" in r else "error" for r in rs)
            peak = ", ".join(f"{r['peak_gib']:.2f}" for r in ok if r.get("peak_gib") is not None)
            mfu = ", ".join(f"{r['flops'] / r['step_s'] / 1e12 / ceiling:.1%}"
                            for r in ok) if ceiling else ""
            first = ", ".join(f"{r['first_step_s']:.1f}" for r in ok)
            lines.append(f"| {cell} | {trainer} | {tps} | {peak} | {mfu} | {first} |")
        b = by_trainer.get("speculators")
        for name in [n for n in by_trainer if n != "speculators"]:
            a = by_trainer.get(name)
            if not (a and b):
                continue
            speed = statistics.median(r["tokens_per_s"] for r in a) / statistics.median(
                r["tokens_per_s"] for r in b)
            line = f"| {cell} | {name} / speculators | {speed:.2f}× tokens/s |"
            pa = [r["peak_gib"] for r in a if r.get("peak_gib") is not None]
            pb = [r["peak_gib"] for r in b if r.get("peak_gib") is not None]
            if pa and pb:
                line += f" {max(pa) / max(pb):.2f}× peak |"
            lines.append(line)
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cells", nargs="+", default=None, help="PRESET:MAX_SEQ_LEN:TTT ...")
    p.add_argument("--trainers", nargs="+", type=trainer_name,
                   default=["trackside", "speculators"])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per child")
    p.add_argument("--smoke", action="store_true", help="CPU: tiny cells, 2 steps")
    p.add_argument("--cap-gib", type=float, default=0,
                   help="cap each child's CUDA allocations (e.g. 96 for a 96 GiB card)")
    p.add_argument("--profile", type=int, default=0, metavar="ROWS",
                   help="print the ROWS costliest kernels of 2 more steps after the timed "
                   "ones (each child's to $OUT/profile-TRAINER-CELL.txt)")
    p.add_argument("--timeline", action="store_true",
                   help="trackside's children also report where the CPU and the GPU are at "
                        "points of a step (each TTT step's layer, backward, optimizer)")
    p.add_argument("--debug-checkpoint", action="store_true",
                   help="with --child: torch.utils.checkpoint's debug mode")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--trainer", type=trainer_name, help=argparse.SUPPRESS)
    p.add_argument("--cell", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args)), flush=True)
        return 0
    if args.smoke:
        args.cells = args.cells or ["tiny:512:3"]
        args.steps, args.warmup, args.repeats = 2, 1, 1
    cells = [Cell.parse(c) for c in (args.cells or DEFAULT_CELLS)]
    gpu = torch.cuda.is_available()
    ceilings = [matmul_ceiling_tflops()] if gpu else []
    if gpu:
        print(f"{torch.cuda.get_device_name()}: bf16 matmul ceiling {ceilings[0]:.0f} TFLOP/s",
              flush=True)
    results = []
    report = {"command": " ".join([Path(sys.executable).name, *sys.argv]),
              "device": torch.cuda.get_device_name() if gpu else "cpu",
              "torch": torch.__version__, "ceiling_tflops": ceilings, "results": results}

    def save() -> None:
        # after every child: a run cut short by its caller's time limit keeps what it did
        if os.environ.get("OUT"):
            Path(os.environ["OUT"], "train_step.json").write_text(json.dumps(report, indent=1))

    for cell in cells:
        for r in range(args.repeats):
            order = args.trainers if r % 2 == 0 else list(reversed(args.trainers))
            for trainer in order:
                result = run_child(trainer, cell, args)
                result["repeat"] = r
                results.append(result)
                save()
                print(f"{cell} #{r + 1} {trainer:11s} {describe(result, ceilings[0] if gpu else None)}",
                      flush=True)
    if gpu:
        ceilings.append(matmul_ceiling_tflops())
        print(f"bf16 matmul ceiling at the end: {ceilings[1]:.0f} TFLOP/s", flush=True)
    save()
    print("\n".join(summarise(results, max(ceilings) if ceilings else None)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
