"""A data directory of random hidden states shaped like a real verifier's, for GPU timing.

Extracting a Llama-3.1-8B or Kimi-K2 verifier needs its weights, which a benchmark box may
not have; throughput and memory depend only on the shapes, so random bf16 states stand in.
The final hidden state at each position leans on its token's embedding, as a real
verifier's does, so the target distribution is a function of the token the drafter is fed:
the loss falls visibly within tens of steps instead of sitting at the noise floor.

    python bench/random_data.py --preset llama3-8b --out /tmp/data-8b --samples 48
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

from training.config import PRESETS
from training.data import (DATASET_JSON, TOKEN_COUNTS_FILE, VERIFIER_FILE, sample_path,
                           write_json_atomic, write_tensors_atomic)



def prompt_len(n: int) -> int:
    """The leading tokens of a sample that carry no loss (its prompt, as chat data has): an
    eighth."""
    return n // 8


def make(preset: str, out: Path, samples: int, length: int, seed: int = 0) -> dict:
    cfg = PRESETS[preset]
    h, vocab = cfg.hidden_size, cfg.vocab_size
    g = torch.Generator().manual_seed(seed)
    out.mkdir(parents=True, exist_ok=True)
    embed = torch.randn(vocab, h, generator=g)
    write_tensors_atomic(out / VERIFIER_FILE, {
        "embed_tokens": (0.02 * embed).bfloat16(),
        "lm_head": (6.0 * torch.randn(vocab, h, generator=g) / h ** 0.5).bfloat16()})
    counts = torch.zeros(vocab, dtype=torch.long)
    lengths = []
    for i in range(samples):
        n = int(length * (0.75 + 0.5 * torch.rand((), generator=g)))
        ids = torch.randint(vocab, (n,), generator=g)
        mask = torch.ones(n, dtype=torch.bool)
        mask[: prompt_len(n)] = False
        write_tensors_atomic(sample_path(out, i), {
            "input_ids": ids, "loss_mask": mask,
            "aux_hidden": torch.randn(n, 3 * h, generator=g).bfloat16(),
            "final_hidden": (embed[ids] + 0.5 * torch.randn(n, h, generator=g)).bfloat16()})
        counts += torch.bincount(ids[mask], minlength=vocab)
        lengths.append(n)
    write_tensors_atomic(out / TOKEN_COUNTS_FILE, {"counts": counts})
    info = {"hidden_size": h, "vocab_size": vocab, "num_layers": 0, "layers": [],
            "dtype": "bfloat16", "num_samples": samples, "lengths": lengths,
            "total_tokens": sum(lengths), "model": f"random:{preset}"}
    write_json_atomic(out / DATASET_JSON, info)
    return info


# DFlash's random data (what `make` is for EAGLE-3): 16 samples of ~2K tokens,
# ~5 packed rows of 8K, 4 GB with the verifier's embedding and head. The hidden states of
# five verifier layers (Qwen3-8B has 36; the five `extract --drafter dflash` captures) are
# random; the verifier's final state leans on its token's embedding and its head maps
# token x's embedding onto σ(x), x's successor in a fixed permutation of a set of active
# tokens that the stream follows 3 times in 4. So the verifier's argmax is the next token
# (73 % of positions), a function of the anchor for the first block position and, through
# σ, likelier so for the later ones: a target a drafter can learn, not noise.
DFLASH_DATA = {"samples": 16, "length": 2048, "depth": 36, "active": 1024, "follow": 0.75}


def make_dflash(preset: str, out: Path, seed: int = 0) -> str:
    from training.config import DFLASH_PRESETS
    from training.extract import default_layers

    spec, cfg = DFLASH_DATA, DFLASH_PRESETS[preset]
    h, vocab = cfg.hidden_size, cfg.vocab_size
    layers = default_layers(spec["depth"], "dflash")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # the big randn on the GPU
    g = torch.Generator().manual_seed(seed)
    on = torch.Generator(device).manual_seed(seed)
    active = torch.randperm(cfg.mask_token_id, generator=g)[: min(spec["active"], cfg.mask_token_id)]
    successor = torch.arange(vocab)
    successor[active] = active[torch.randperm(len(active), generator=g)]
    embed = torch.randn(vocab, h, generator=on, device=device)
    head = 0.02 * torch.randn(vocab, h, generator=on, device=device)
    chosen = embed[active.to(device)]
    head[successor[active].to(device)] = 10.0 * chosen / chosen.norm(dim=-1, keepdim=True) ** 2
    out.mkdir(parents=True, exist_ok=True)
    write_tensors_atomic(out / VERIFIER_FILE, {"embed_tokens": (0.02 * embed).bfloat16().cpu(),
                                               "lm_head": head.bfloat16().cpu()})  # fmt: skip
    counts = torch.zeros(vocab, dtype=torch.long)
    lengths, after = [], successor.tolist()
    for i in range(spec["samples"]):
        n = int(spec["length"] * (0.75 + 0.5 * torch.rand((), generator=g)))
        follow = (torch.rand(n, generator=g) < spec["follow"]).tolist()
        jumps = active[torch.randint(len(active), (n,), generator=g)].tolist()
        ids = [jumps[0]]
        for t in range(1, n):
            ids.append(after[ids[-1]] if follow[t] else jumps[t])
        ids = torch.tensor(ids)
        mask = torch.ones(n, dtype=torch.bool)
        mask[: prompt_len(n)] = False
        final = embed[ids.to(device)] + 0.5 * torch.randn(n, h, generator=on, device=device)
        write_tensors_atomic(sample_path(out, i), {
            "input_ids": ids, "loss_mask": mask,
            "aux_hidden": torch.randn(n, len(layers) * h, generator=on, device=device).bfloat16().cpu(),
            "final_hidden": final.bfloat16().cpu()})  # fmt: skip
        counts += torch.bincount(ids[mask], minlength=vocab)
        lengths.append(n)
    write_tensors_atomic(out / TOKEN_COUNTS_FILE, {"counts": counts})
    write_json_atomic(out / DATASET_JSON, {
        "hidden_size": h, "vocab_size": vocab, "num_layers": spec["depth"], "layers": layers, "dtype": "bfloat16",
        "num_samples": len(lengths), "lengths": lengths, "total_tokens": sum(lengths), "model": f"random:{preset}",
    })  # fmt: skip
    return f"wrote {len(lengths)} samples, {sum(lengths)} tokens, layers {layers} to {out} (on {device.type})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drafter", choices=["eagle3", "dflash"], default="eagle3")
    parser.add_argument("--preset", required=True, help="a preset of the drafter's (llama3-8b, qwen3-8b, ...)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--samples", type=int, default=48)
    parser.add_argument("--length", type=int, default=2048, help="mean tokens per sample")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.drafter == "dflash":  # its own sample count and length (DFLASH_DATA)
        print(make_dflash(args.preset, args.out, args.seed))
        return
    info = make(args.preset, args.out, args.samples, args.length, args.seed)
    print(f"wrote {info['num_samples']} samples, {info['total_tokens']} tokens to {args.out}")


if __name__ == "__main__":
    main()
