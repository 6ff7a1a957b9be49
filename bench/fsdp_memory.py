"""FSDP against DDP: each rank's peak GPU memory over a few training steps, beside what the
memory model (training/memory) predicts for the same run.

    python bench/fsdp_memory.py --nproc-per-node 8           # kimi-k2 EAGLE-3 and the story
                                                              # DFlash drafter, ddp and fsdp
    python bench/fsdp_memory.py --nproc-per-node 8 --drafter dflash --max-seq-len 8192
    python bench/fsdp_memory.py --smoke                       # CPU, gloo, tiny shapes

Each (drafter, sharding) is the real trainer (`trackside train`, training/cli.py) under
its own `torchrun --nproc-per-node N`, on random data of the preset's shapes (the peak
depends on shapes, not values): its step events' peak_mem_gib_ranks are each rank's
torch.cuda.max_memory_allocated. A launch of its own each, because a peak is the
process's and a process group cannot be made again under one torchrun launch (a second
init_process_group hangs). The prediction is training/memory's for the run's own start
event (training.drafters.measured.shape_from_start, as `trackside fit --from-run` reads it),
uncalibrated; `delta` is each sharding's peak less DDP's, where what the activations
model misses cancels and the FSDP terms (sharded weights and AdamW state against
gathered groups and DDP's buckets) are what is left. The trainer's last checkpoint is
written too, and its time reported: it gathers the whole drafter and its AdamW state to
rank 0.

With --smoke: the tiny presets on the synthetic data, on the CPU over gloo: it shows the
trainer runs both shardings and the bench reads them; a CPU has no allocator peak to
compare, so no memory figures are printed.

Not yet run on several GPUs: the session that wrote it had one H200 lent (multi-GPU
machines withheld), so every figure for N > 1 is still to be measured. JSON goes to
$OUT/fsdp_memory.json when OUT is set. What one H200 gave (torch 2.11, N = 1, 4,096
tokens, 3 steps; FSDP over a group of one gathers into buffers of its own all the same):
kimi-k2 EAGLE-3 under DDP peaked at 25.09 GiB against 25.60 predicted, the story DFlash
drafter at 71.85 GiB against 75.07 (its checkpoint, gathered and written, 56 s). Its
EAGLE-3 run under FSDP showed the trainer then took no gradient at all (every sharded
parameter's None after backward: torch 2.11's FSDP finds the outputs to hook by pytree,
blind to the StepLoss dataclass; training/loop.Unroll now returns plain tensors, tested on
the CPU with 2.11's lookup), so its figures are void and the fix is unrun on a GPU; the
DFlash FSDP run outlasted the call. A tiny DFlash drafter under FSDP on that H200 matched
DDP's loss over 3 steps to 5 decimals.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from itertools import pairwise
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from training.drafters.eagle3 import memory
from training.config import DFLASH_PRESETS, DFLASH_TRAINING_PRESETS, PRESETS
from training.drafters.dflash import memory as dflash_memory
from training.drafters.measured import shape_from_start
from training.params import anchor_room

GiB = 2**30
# The issue's drafters: Kimi-K2's EAGLE-3 head, and the story's five-layer DFlash drafter
# at hidden 7168 (~3B parameters, ~48 GB of AdamW state).
DRAFTERS = {"eagle3": "kimi-k2", "dflash": "story"}


def make_data(out: Path, hidden: int, vocab: int, layers: int, samples: int,
              length: int) -> None:
    """Random bf16 hidden states of a verifier's shapes, `layers` of them captured, in the
    layout `trackside extract` writes (training/data.py)."""
    import torch

    from training.data import (
        DATASET_JSON,
        TOKEN_COUNTS_FILE,
        VERIFIER_FILE,
        sample_path,
        write_json_atomic,
        write_tensors_atomic,
    )

    g = torch.Generator().manual_seed(0)
    out.mkdir(parents=True, exist_ok=True)
    write_tensors_atomic(out / VERIFIER_FILE, {
        name: torch.randn(vocab, hidden, generator=g, dtype=torch.bfloat16) * 0.02
        for name in ("embed_tokens", "lm_head")})
    counts = torch.zeros(vocab, dtype=torch.long)
    for i in range(samples):
        ids = torch.randint(vocab, (length,), generator=g)
        mask = torch.ones(length, dtype=torch.bool)
        mask[: length // 8] = False
        write_tensors_atomic(sample_path(out, i), {
            "input_ids": ids, "loss_mask": mask,
            "aux_hidden": torch.randn(length, layers * hidden, generator=g,
                                      dtype=torch.bfloat16),
            "final_hidden": torch.randn(length, hidden, generator=g, dtype=torch.bfloat16)})
        counts += torch.bincount(ids[mask], minlength=vocab)
    write_tensors_atomic(out / TOKEN_COUNTS_FILE, {"counts": counts})
    num_layers = 4 * layers  # a verifier deep enough that the captured layers are spread
    write_json_atomic(out / DATASET_JSON, {
        "hidden_size": hidden, "vocab_size": vocab, "num_layers": num_layers,
        "layers": list(range(1, num_layers, 4))[:layers], "dtype": "bfloat16",
        "num_samples": samples, "lengths": [length] * samples,
        "total_tokens": samples * length, "model": "random"})


def events(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def predicted(start: dict) -> memory.Prediction:
    cfg, shape = shape_from_start(start)
    if isinstance(shape, dflash_memory.DFlashShape):
        return dflash_memory.predict(cfg, shape)
    return memory.predict(cfg, shape)


def run_one(drafter: str, sharding: str, args, data: list[str], work: Path) -> dict:
    run_dir = work / f"{drafter}-{sharding}"
    argv = ["train", *data, "--sharding", sharding, "--steps", str(args.steps),
            "--max-seq-len", str(args.max_seq_len), "--save-every", "0",
            "--out", str(run_dir)]
    if drafter == "dflash":
        argv += ["--drafter", "dflash"]
    if not args.smoke:
        argv += ["--preset", DRAFTERS[drafter], "--device", "cuda"]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", str(args.nproc_per_node), "-m", "training", *argv]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    row = {"drafter": drafter, "preset": "tiny" if args.smoke else DRAFTERS[drafter],
           "sharding": sharding, "world_size": args.nproc_per_node,
           "exit_status": done.returncode}
    if done.returncode != 0:
        row["error"] = done.stderr[-2000:]
        return row
    seen = events(run_dir)
    start = next(e for e in seen if e["event"] == "start")
    steps = [e for e in seen if e["event"] == "step"]
    saved = [e for e in seen if e["event"] == "checkpoint"]
    row.update(loss=[e["loss"] for e in steps],
               step_s=[round(b["time"] - a["time"], 3) for a, b in pairwise(steps)],
               checkpoint_s=round(saved[-1]["time"] - steps[-1]["time"], 2))
    if not args.smoke:
        ranks = [e.get("peak_mem_gib_ranks", [e["peak_mem_gib"]]) for e in steps]
        prediction = predicted(start)
        row.update(peak_gib_ranks=[max(r) for r in zip(*ranks)],
                   predicted_gib=prediction.total / GiB,
                   predicted_phase=prediction.phase,
                   predicted_terms_gib={k: v / GiB for k, v in prediction.breakdown().items()
                                        if k != "allocator_slack"})
    shutil.rmtree(run_dir)  # the story's checkpoint alone is ~36 GB
    return row


def describe(rows: list[dict]) -> str:
    lines = []
    ddp = {r["drafter"]: r for r in rows if r["sharding"] == "ddp" and "peak_gib_ranks" in r}
    for r in rows:
        head = f"{r['preset']:>8} {r['drafter']:>6} {r['sharding']:>4} x{r['world_size']}"
        if r["exit_status"]:
            lines.append(f"{head}: failed ({r['exit_status']}): {r['error'][-300:]}")
            continue
        text = (f"{head}: loss {', '.join(f'{x:.4f}' for x in r['loss'])}; "
                f"checkpoint {r['checkpoint_s']:.1f} s")
        if "peak_gib_ranks" in r:
            peak, base = max(r["peak_gib_ranks"]), ddp.get(r["drafter"])
            text += (f"; peak {peak:.2f} GiB (ranks {min(r['peak_gib_ranks']):.2f}-{peak:.2f})"
                     f", predicted {r['predicted_gib']:.2f} ({r['predicted_phase']})")
            if base is not None and base is not r:
                text += (f"; delta vs ddp {peak - max(base['peak_gib_ranks']):+.2f}, "
                         f"predicted {r['predicted_gib'] - base['predicted_gib']:+.2f}")
        lines.append(text)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc-per-node", type=int, default=None,
                   help="GPUs (default: every visible one; 2 CPU processes with --smoke)")
    p.add_argument("--drafter", choices=["eagle3", "dflash", "both"], default="both")
    p.add_argument("--max-seq-len", type=int, default=None,
                   help="default 4096 (256 with --smoke)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--smoke", action="store_true", help="tiny, CPU, gloo: no memory figures")
    p.add_argument("--work", type=Path, help="data and run dirs (default: a temporary dir)")
    args = p.parse_args(argv)
    if args.nproc_per_node is None:
        import torch

        args.nproc_per_node = 2 if args.smoke else torch.cuda.device_count()
    args.max_seq_len = args.max_seq_len or (256 if args.smoke else 4096)
    drafters = ["eagle3", "dflash"] if args.drafter == "both" else [args.drafter]
    work = args.work or Path(tempfile.mkdtemp(prefix="fsdp-memory-"))
    rows = []
    for drafter in drafters:
        if args.smoke:
            data = ["--synthetic"]
        else:
            cfg = PRESETS["kimi-k2"] if drafter == "eagle3" else DFLASH_PRESETS["story"]
            layers = 3 if drafter == "eagle3" else cfg.num_target_layers
            # A sample a row, a global batch of them per step
            make_data(work / drafter, cfg.hidden_size, cfg.vocab_size, layers,
                      args.nproc_per_node, args.max_seq_len)
            data = ["--data", str(work / drafter)]
            if drafter == "dflash":
                anchors = DFLASH_TRAINING_PRESETS["story"]["max_anchors"]
                data += ["--max-anchors", str(min(anchors, anchor_room(args.max_seq_len, cfg.block_size)))]
        for sharding in memory.SHARDINGS:
            rows.append(run_one(drafter, sharding, args, data, work))
            print(describe(rows[-1:]), flush=True)
    print("\n" + describe(rows))
    if os.environ.get("OUT"):
        out = Path(os.environ["OUT"]) / "fsdp_memory.json"
        out.write_text(json.dumps({"argv": sys.argv, "rows": rows}, indent=1))
        print(f"wrote {out}")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if all(r["exit_status"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
