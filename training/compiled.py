"""torch.compile for the trainer's elementwise islands, on CUDA only.

Norms, RoPE, SwiGLU and the loss's per-chunk softmax work are chains of small
elementwise kernels that each read and write whole [tokens x hidden] or
[chunk x vocab] tensors; compiled, each chain is one or two fused kernels. They are
compiled with dynamic shapes, so one graph serves every row length and a relaunch with a
new max_seq_len finds it in inductor's on-disk cache instead of compiling again. CPU
tensors (the tests, the demo) run the same functions eagerly.
"""
from __future__ import annotations

import functools

import torch

# One island serves several graphs: a norm of [B, L, H] activations and of [P, H] gathered
# positions, in bf16 and fp32, with and without gradient. fullgraph=True turns Dynamo's
# default limit of 8 recompilations per function into a hard error, hit by a process that
# both evaluates in fp32 and trains under bf16.
torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)


def cuda_compiled(fn):
    compiled = None

    @functools.wraps(fn)
    def call(*args, **kwargs):
        nonlocal compiled
        if not args[0].is_cuda:
            return fn(*args, **kwargs)
        if compiled is None:
            compiled = torch.compile(fn, dynamic=True, fullgraph=True)
        return compiled(*args, **kwargs)
    return call
