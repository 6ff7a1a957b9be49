"""`--synthetic`: a tiny verifier and a data set whose structure a drafter can learn.

A randomly initialised LM predicts near-uniform distributions, which no drafter can learn
to imitate in a minute. This verifier is built to be confident: its token embeddings
dominate the residual stream (the random layers add a little context), and its lm_head
maps the embedding of token x onto σ(x) for a fixed permutation σ of an active set of
tokens, so it puts ~90 % of its mass on σ(next token). The token stream follows σ most of
the time, so the verifier is usually right and the drafter's TTT steps are learnable too.

The data set is a pure function of the seed and is cached (XDG cache directory), because
the demo starts runs often; the verifier's shape is the "tiny" preset's.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

from training.config import PRESETS
from training.data import DATASET_JSON
from training.extract import extract

VERSION = 2  # bump when the generated data changes, so stale caches are not reused
NUM_LAYERS = 8
NUM_SAMPLES = 256
ACTIVE_TOKENS = 200  # fits the tiny preset's 256-token draft vocabulary
FOLLOW_PROB = 0.75
PROMPT_TOKENS = 8  # leading tokens without loss, as a chat prompt would have
LENGTHS = (48, 160)
LOGIT_SCALE = 1.2


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "trackside"


def make_verifier(seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    tiny = PRESETS["tiny"]
    config = LlamaConfig(
        hidden_size=tiny.hidden_size, intermediate_size=tiny.intermediate_size,
        num_hidden_layers=NUM_LAYERS, num_attention_heads=tiny.num_heads,
        num_key_value_heads=tiny.num_kv_heads, vocab_size=tiny.vocab_size,
        rope_theta=tiny.rope_theta, max_position_embeddings=4096,
        tie_word_embeddings=False)
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    embed = torch.randn(config.vocab_size, config.hidden_size, generator=g)
    sigma = torch.randperm(ACTIVE_TOKENS, generator=g)
    head = 0.02 * torch.randn(config.vocab_size, config.hidden_size, generator=g)
    unit = embed / embed.norm(dim=-1, keepdim=True)
    head[sigma] = LOGIT_SCALE * unit[:ACTIVE_TOKENS]  # row σ(x) points along x's embedding
    with torch.no_grad():
        model.get_input_embeddings().weight.copy_(embed)
        model.get_output_embeddings().weight.copy_(head)
    return model, sigma


def make_samples(sigma: torch.Tensor, seed: int) -> list[tuple[list[int], list[bool]]]:
    g = torch.Generator().manual_seed(seed + 1)
    samples = []
    for _ in range(NUM_SAMPLES):
        n = int(torch.randint(LENGTHS[0], LENGTHS[1] + 1, (1,), generator=g))
        ids = [int(torch.randint(ACTIVE_TOKENS, (1,), generator=g))]
        follow = torch.rand(n, generator=g) < FOLLOW_PROB
        jumps = torch.randint(ACTIVE_TOKENS, (n,), generator=g)
        for t in range(1, n):
            ids.append(int(sigma[ids[-1]]) if follow[t] else int(jumps[t]))
        samples.append((ids, [t >= PROMPT_TOKENS for t in range(n)]))
    return samples


def synthetic_dataset(seed: int = 0, log=print) -> Path:
    """The cached data directory for `seed`, generated on first use."""
    final = cache_root() / f"synthetic-v{VERSION}-seed{seed}"
    if (final / DATASET_JSON).is_file():
        return final
    tmp = final.with_name(f".tmp-{os.getpid()}-{final.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    log(f"synthetic: making a tiny verifier and {NUM_SAMPLES} samples in {final}")
    model, sigma = make_verifier(seed)
    extract(model, make_samples(sigma, seed), tmp, log=log)
    try:
        os.rename(tmp, final)
    except OSError:  # another process made it first; theirs is the same data
        shutil.rmtree(tmp, ignore_errors=True)
    return final
