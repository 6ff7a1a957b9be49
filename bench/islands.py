"""The trainer's compiled elementwise islands, one at a time, against the memory bandwidth.

A profile of a llama3-8b 8192 × TTT 5 step (docs/benchmarks.md, "An 8192 × TTT 5 step by
kernel kind") has the compiled islands at ~10 % of the kernel time, and its rope kernels
at 170-320 µs a call for 128 MB read and written, several times what an H200's bandwidth
allows. Each island here runs at one cell's shapes, as the trainer calls it (bf16
activations, fp32 weights and tables), three ways: as the trainer compiles it
(training/compiled.py: only the dims that change with the row symbolic), with every size
symbolic (dynamic=True, how the trainer compiled them before docs/benchmarks.md,
"Compiled islands: which sizes are symbols") and with static shapes; the diagonal-key
fold and the loss chunk, no compiled islands (Triton kernels on CUDA), once, as the
trainer runs them. Each row: the median time of a call, forward (and forward + backward
where the trainer takes a gradient), the bytes the call must read and write, and the
bandwidth that makes against a device-to-device copy measured in the same run.

    python bench/islands.py                               # H200: llama3-8b at 8192
    python bench/islands.py --cell kimi-k2:65536:5
    python bench/islands.py --smoke                       # CPU: tiny shapes, eager

With OUT set, also writes $OUT/islands.json.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from bench.timing import median_seconds  # noqa: E402
from training import layers  # noqa: E402
from training.drafters.eagle3 import attention, loss, model  # noqa: E402
from training.config import PRESETS  # noqa: E402


def islands(preset: str, L: int, ttt_steps: int, device: torch.device,
            dtype: torch.dtype) -> dict:
    """name: (function as the trainer defines it, its inputs, whether a gradient is taken)."""
    cfg = PRESETS[preset]
    H, I, D, Hq = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim, cfg.num_heads
    Hkv, K = cfg.num_kv_heads, ttt_steps
    g = torch.Generator(device=device).manual_seed(0)
    f32 = torch.float32 if dtype != torch.float64 else dtype

    def rand(*shape, kind=dtype, grad=False):
        return torch.randn(*shape, generator=g, device=device, dtype=kind).requires_grad_(grad)
    cos, sin = layers.rotary_tables(torch.arange(L, device=device)[None], D, cfg.rope_theta, f32)
    chunk = min(2048, L)
    # the verifier's rows a chunk reads, in order, as the trainer's mostly are (a table of
    # just those, so that the bytes counted are the bytes read)
    probs = torch.softmax(rand(chunk, cfg.draft_vocab_size, kind=f32), -1).to(dtype)
    rows = torch.arange(chunk, device=device)
    fold, unfold = attention._fold_passes(torch.empty(0, device=device))
    return {
        "rms_norm [L, H]": (layers.rms_norm, (rand(1, L, H, grad=True), rand(H, kind=f32, grad=True),
                                             cfg.rms_norm_eps), True),
        # the embedding's (no gradient) and the hidden state's, into one [L, 2H]
        "input norms side by side [L, 2H]": (model.side_by_side_norms,
                                             (rand(1, L, H), rand(1, L, H, grad=True),
                                              rand(H, kind=f32, grad=True),
                                              rand(H, kind=f32, grad=True), cfg.rms_norm_eps),
                                             True),
        # q as q_proj's output comes to rope: [B, L, heads, D]
        "rope q [L, heads, D]": (layers.rope, (rand(1, L, Hq, D, grad=True), cos, sin), True),
        "swiglu [L, I]": (layers.swiglu, (rand(1, L, I), rand(1, L, I)), False),
        "swiglu_backward [L, I]": (layers.swiglu_backward,
                                   (rand(1, L, I), rand(1, L, I), rand(1, L, I)), False),
        "verifier targets [chunk, V]": (loss._target_chunk,
                                        (rand(chunk, cfg.draft_vocab_size),), False),
        # Triton on CUDA (training/loss_triton.py), no compiled island
        "loss chunk [chunk, V]": (loss._chunk_pass(probs),
                                  (rand(chunk, cfg.draft_vocab_size), probs, rows, True), False),
        # the last TTT step's fold of its K - 1 diagonal keys, forward and backward, as the
        # trainer runs it here (Triton kernels on CUDA)
        "fold forward (K-1 keys)": (fold,
                                    (rand(1, Hq, L, D), rand(1, Hq, L, D), rand(1, Hq, L, kind=f32),
                                     rand(K - 1, 1, Hkv, L, D), rand(K - 1, 1, Hkv, L, D)), False),
        "fold backward (K-1 keys)": (unfold,
                                     (rand(1, Hq, L, D), rand(1, Hq, L, D), rand(1, Hq, L, D),
                                      torch.softmax(rand(K, 1, Hkv, Hq // Hkv, L, kind=f32), 0),
                                      rand(K - 1, 1, Hkv, L, D), rand(K - 1, 1, Hkv, L, D)), False),
    }


def nbytes(tree) -> int:
    if isinstance(tree, torch.Tensor):
        return tree.numel() * tree.element_size()
    if isinstance(tree, (tuple, list)):
        return sum(nbytes(t) for t in tree)
    return 0


def copy_bandwidth(device: torch.device, reps: int) -> float:
    """Bytes per second of a 1 GiB device-to-device copy (read + write counted)."""
    src = torch.empty(2**30 // 4 if device.type == "cuda" else 2**22, device=device)
    dst = torch.empty_like(src)
    return 2 * nbytes(src) / median_seconds(lambda: dst.copy_(src), reps, device)


def measure(name: str, fn, args: tuple, grad: bool, mode: str, device, reps: int) -> dict:
    call = fn  # "trainer": compiled by cuda_compiled on CUDA, eager on the CPU
    if mode != "trainer":
        call = torch.compile(fn.__wrapped__, dynamic=mode == "dynamic", fullgraph=True)
    started = time.perf_counter()
    out = call(*args)
    first = time.perf_counter() - started
    row = {"island": name, "mode": mode, "first_call_s": first,
           "bytes": nbytes(args) + nbytes(out),
           "s": median_seconds(lambda: call(*args), reps, device)}
    if grad:
        inputs = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
        upstream = torch.randn_like(out)

        def forward_backward():
            torch.autograd.grad(call(*args), inputs, upstream)
        # the least forward and backward move: the forward's bytes, then the upstream
        # gradient and the inputs read again, the inputs' gradients written
        row["fb_bytes"] = row["bytes"] + nbytes(upstream) + 2 * nbytes(inputs)
        row["fb_s"] = median_seconds(forward_backward, reps, device)
    torch._dynamo.reset()
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cell", default="llama3-8b:8192:5", help="PRESET:MAX_SEQ_LEN[:TTT]")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--smoke", action="store_true", help="CPU: the tiny preset, eager only")
    args = p.parse_args(argv)
    preset, length, *rest = args.cell.split(":")
    ttt_steps = int(rest[0]) if rest else 5
    if preset not in PRESETS:
        raise SystemExit(f"unknown preset {preset!r} (known: {', '.join(PRESETS)})")
    gpu = torch.cuda.is_available() and not args.smoke
    device = torch.device("cuda" if gpu else "cpu")
    if args.smoke:
        preset, length, ttt_steps, args.reps = "tiny", "256", 3, 2
    modes = ("trainer", "dynamic", "static") if gpu else ("trainer",)
    bandwidth = copy_bandwidth(device, args.reps)
    dtype = torch.bfloat16 if gpu else torch.float32
    print(f"{torch.cuda.get_device_name() if gpu else 'cpu'}: copy {bandwidth / 1e9:.0f} GB/s; "
          f"{preset} at {length} tokens, {dtype}", flush=True)
    rows = []
    for name, (fn, inputs, grad) in islands(preset, int(length), ttt_steps, device,
                                            dtype).items():
        # the fold and the loss chunk are not compiled islands: no compiled variants
        for mode in modes if hasattr(fn, "__wrapped__") else ("trainer",):
            row = measure(name, fn, inputs, grad, mode, device, args.reps)
            rows.append(row)
            text = (f"{name:26s} {mode:8s} {row['s'] * 1e6:8.1f} us "
                    f"{row['bytes'] / row['s'] / bandwidth * 100:5.1f} % of copy")
            if grad:
                text += (f"   fwd+bwd {row['fb_s'] * 1e6:8.1f} us "
                         f"{row['fb_bytes'] / row['fb_s'] / bandwidth * 100:5.1f} %")
            print(text + f"   (first call {row['first_call_s']:.1f} s)", flush=True)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "islands.json").write_text(json.dumps(
            {"command": " ".join([Path(sys.executable).name, *sys.argv]),
             "device": str(device), "copy_bytes_per_s": bandwidth, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
