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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--samples", type=int, default=48)
    parser.add_argument("--length", type=int, default=2048, help="mean tokens per sample")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    info = make(args.preset, args.out, args.samples, args.length, args.seed)
    print(f"wrote {info['num_samples']} samples, {info['total_tokens']} tokens to {args.out}")


if __name__ == "__main__":
    main()
