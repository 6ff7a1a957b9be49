"""One draft layer's DFlash attention at a step's shape: the BlockMask's build, flex's
forward and forward + backward, for the trainer's mask and kernel options and the
alternatives they were chosen over.

Inputs as bench/dflash_step.py makes them (one packed row of samples of 1,536-2,560
tokens, anchors drawn by the trainer's sample_anchors), q/k/v random in bf16 at the
drafter's heads. Variants:
- trainer: training/drafters/dflash/mask.py as the trainer runs it (BlockMask from the slots'
  context ranges, flex compiled with dynamic shapes, its kernel options);
- no-options: the same without kernel options (inductor's tiles, edges masked);
- static: the trainer's, flex compiled for this shape alone;
- create-block-mask: the mask that torch's create_block_mask (compiled) derives from the
  same mask_mod, element by element, as speculators builds its own; trainer's options.
Every variant's output is compared with the trainer's.

    python bench/dflash_attention.py [--preset qwen3-8b --max-seq-len 8192 --max-anchors 512]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
from torch.nn.attention.flex_attention import create_block_mask, flex_attention  # noqa: E402

from bench.dflash_step import QWEN3, drafter_config, packed_row  # noqa: E402
from bench.timing import median_seconds  # noqa: E402
from training.flex import flex_kernel_options  # noqa: E402
from training.drafters.dflash.anchors import sample_anchors  # noqa: E402
from training.drafters.dflash.mask import BlockLayout, block_mask_mod  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default=QWEN3["preset"])
    p.add_argument("--max-seq-len", type=int, default=QWEN3["max_seq_len"])
    p.add_argument("--max-anchors", type=int, default=QWEN3["max_anchors"])
    p.add_argument("--block-size", type=int, default=QWEN3["block_size"])
    p.add_argument("--reps", type=int, default=10)
    args = p.parse_args(argv)
    dev = torch.device("cuda")
    spec = {"preset": args.preset, "max_seq_len": args.max_seq_len,
            "block_size": args.block_size}
    cfg = drafter_config(spec)
    row = packed_row(spec, dev, torch.bfloat16)
    torch.manual_seed(0)
    anchors, _ = sample_anchors(row["loss_mask"], row["doc_ids"], args.block_size,
                                args.max_anchors)
    L, Q, D = args.max_seq_len, args.max_anchors * args.block_size, cfg.head_dim
    g = torch.Generator(device=dev).manual_seed(1)
    q = torch.randn(1, cfg.num_heads, Q, D, generator=g, device=dev, dtype=torch.bfloat16)
    k, v = (torch.randn(1, cfg.num_kv_heads, L + Q, D, generator=g, device=dev,
                        dtype=torch.bfloat16) for _ in range(2))
    for t in (q, k, v):
        t.requires_grad_()
    up = torch.randn_like(q)

    layout = BlockLayout(row["doc_ids"], anchors, args.block_size)
    rule = block_mask_mod(row["doc_ids"], anchors, args.block_size)
    built = torch.compile(create_block_mask)
    dynamic, static = torch.compile(flex_attention, dynamic=True), torch.compile(flex_attention)
    options = flex_kernel_options(q, layout.divisible)

    masks = {
        "ranges": lambda: BlockLayout(row["doc_ids"], anchors, args.block_size).mask,
        "create_block_mask": lambda: built(rule, 1, None, Q, L + Q, device=dev),
    }
    variants = {"trainer": ("ranges", dynamic, options),
                "no-options": ("ranges", dynamic, None),
                "static": ("ranges", static, options),
                "create-block-mask": ("create_block_mask", dynamic, options)}
    results, reference = [], None
    for name, (mask_name, attend, opts) in variants.items():
        t0 = time.perf_counter()
        mask = masks[mask_name]()
        out = attend(q, k, v, block_mask=mask, enable_gqa=True, kernel_options=opts)
        torch.autograd.grad(out, (q, k, v), up)
        torch.cuda.synchronize()
        first = time.perf_counter() - t0
        if reference is None:
            reference = out.detach()
        diff = (out.detach().float() - reference.float()).abs().max().item()

        def forward(attend=attend, mask=mask, opts=opts):
            return attend(q, k, v, block_mask=mask, enable_gqa=True, kernel_options=opts)

        def both(forward=forward):
            torch.autograd.grad(forward(), (q, k, v), up)
        r = {"variant": name, "mask_ms": 1e3 * median_seconds(masks[mask_name], args.reps, dev),
             "fwd_ms": 1e3 * median_seconds(forward, args.reps, dev),
             "fwd_bwd_ms": 1e3 * median_seconds(both, args.reps, dev),
             "first_s": first, "max_diff": diff,
             "blocks": int(mask.kv_num_blocks.sum()), "full_blocks":
             int(mask.full_kv_num_blocks.sum()) if mask.full_kv_num_blocks is not None else 0}
        results.append(r)
        print(f"{name:18s} mask {r['mask_ms']:6.2f} ms  fwd {r['fwd_ms']:6.2f} ms  "
              f"fwd+bwd {r['fwd_bwd_ms']:6.2f} ms  first {first:5.1f} s  partial/full "
              f"blocks {r['blocks']}/{r['full_blocks']}  max diff {diff:.2e}", flush=True)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "dflash_attention.json").write_text(json.dumps(
            {"command": " ".join([Path(sys.executable).name, *sys.argv]),
             "shape": vars(args), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
