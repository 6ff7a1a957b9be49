"""The MLP's matmuls of one TTT step in bf16 and in fp8, one at a time, and fp8's casts.

`train --fp8` sped the EAGLE-3 step up on an H100 and slowed it down on an H200, with the
same code and torch (docs/benchmarks.md, "The EAGLE-3 training step against
speculators"). This says which part differs: each matmul the MLP runs in a step (forward,
the input's gradient, the weight's gradient; gate and up stacked, then down), as bf16
`a @ bᵀ`, as training/fp8.py's `_scaled_mm` (fp32 accumulation) and with cuBLAS's fast
accumulation, and each cast training/fp8.py compiles, at a preset's sizes. Each row: the
median time of a call, and TFLOP/s for the matmuls, GB/s for the casts.

    python bench/fp8_matmul.py                          # llama3-8b, 8192 tokens
    python bench/fp8_matmul.py --preset qwen3-8b-dflash --tokens 8192
    python bench/fp8_matmul.py --smoke                  # CPU: tiny shapes, the casts only

With OUT set, also writes $OUT/fp8_matmul.json.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from bench.timing import median_seconds  # noqa: E402
from training import fp8, layers  # noqa: E402
from training.drafters import DRAFTERS  # noqa: E402


def matmuls(tokens: int, hidden: int, inter: int) -> dict[str, tuple[int, int, int]]:
    """name: (M, N, K) of `a [M x K] @ b [N x K]ᵀ`, as training/fp8.py calls each."""
    return {
        "gate_up forward": (tokens, 2 * inter, hidden),
        "gate_up input grad": (tokens, hidden, 2 * inter),
        "gate_up weight grad": (2 * inter, hidden, tokens),
        "down forward": (tokens, hidden, inter),
        "down input grad": (tokens, inter, hidden),
        "down weight grad": (hidden, inter, tokens),
    }


def run(tokens: int, hidden: int, inter: int, device: torch.device, reps: int) -> list[dict]:
    rows = []
    g = torch.Generator(device=device).manual_seed(0)

    def rand(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, generator=g, device=device, dtype=torch.float32).to(dtype)

    if device.type == "cuda":
        one = torch.ones((), device=device)
        for name, (M, N, K) in matmuls(tokens, hidden, inter).items():
            a, b = rand(M, K), rand(N, K)
            a8, b8 = a.to(fp8.E4M3), b.to(fp8.E4M3)
            flop = 2 * M * N * K
            for kind, fn in (
                    ("bf16", lambda: a @ b.t()),
                    ("fp8", lambda: torch._scaled_mm(a8, b8.t(), scale_a=one, scale_b=one,
                                                     out_dtype=torch.bfloat16)),
                    ("fp8 fast accum", lambda: torch._scaled_mm(
                        a8, b8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16,
                        use_fast_accum=True))):
                s = median_seconds(fn, reps, device)
                rows.append({"name": f"{name} {kind}", "shape": [M, N, K], "ms": s * 1e3,
                             "tflops": flop / s / 1e12})
            del a, b, a8, b8
    x, grad = rand(tokens, hidden), rand(tokens, hidden)
    gate_up, weight = rand(tokens, 2 * inter), rand(2 * inter, hidden, dtype=torch.float32)
    # to_fp8 reads bf16 and writes fp8 twice (as A, and transposed); swiglu's casts read
    # gate and up and write fp8 of half their size; weights_to_fp8 reads fp32.
    casts = {  # name: (call, bytes read and written)
        "to_fp8 [tokens x hidden] e4m3": (lambda: fp8.to_fp8(x, fp8.E4M3), x.numel() * 4),
        "to_fp8 [tokens x hidden] e5m2 (down's grad)": (lambda: fp8.to_fp8(grad, fp8.E5M2),
                                                        grad.numel() * 4),
        "to_fp8 [tokens x 2 inter] e5m2 (gate_up's grad)": (
            lambda: fp8.to_fp8(gate_up, fp8.E5M2), gate_up.numel() * 4),
        "weights_to_fp8 [2 inter x hidden]": (lambda: fp8.weights_to_fp8([(weight,)]),
                                              weight.numel() * (4 + 2)),
        "swiglu_to_fp8 [tokens x 2 inter]": (lambda: layers.swiglu_to_fp8(gate_up),
                                             gate_up.numel() * 2 + gate_up.numel() // 2),
        "swiglu_to_fp8_t [tokens x 2 inter]": (lambda: layers.swiglu_to_fp8_t(gate_up),
                                               gate_up.numel() * 2 + gate_up.numel() // 2),
    }
    for name, (fn, nbytes) in casts.items():
        s = median_seconds(fn, reps, device)
        rows.append({"name": name, "ms": s * 1e3, "gbps": nbytes / s / 1e9})
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="llama3-8b")
    p.add_argument("--drafter", default="eagle3", choices=list(DRAFTERS))
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--smoke", action="store_true", help="CPU, tiny sizes: the casts only")
    args = p.parse_args()
    if args.smoke:
        device, (tokens, hidden, inter) = torch.device("cpu"), (32, 64, 128)
    else:
        device = torch.device("cuda")
        cfg = DRAFTERS[args.drafter].presets[args.preset]
        tokens, hidden, inter = args.tokens, cfg.hidden_size, cfg.intermediate_size
    rows = run(tokens, hidden, inter, device, args.reps)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(f"{name}, torch {torch.__version__}: {tokens} tokens, hidden {hidden}, "
          f"intermediate {inter}")
    for row in rows:
        rate = f"{row['tflops']:7.1f} TFLOP/s" if "tflops" in row else f"{row['gbps']:7.1f} GB/s"
        print(f"  {row['name']:<48} {row['ms']:8.3f} ms  {rate}")
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "fp8_matmul.json").write_text(json.dumps(
            {"device": name, "torch": torch.__version__, "tokens": tokens, "hidden": hidden,
             "intermediate": inter, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
