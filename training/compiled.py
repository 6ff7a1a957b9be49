"""torch.compile for the trainer's elementwise islands, on CUDA only.

Norms, RoPE, SwiGLU and the verifier's per-chunk softmax are chains of small
elementwise kernels that each read and write whole [tokens x hidden] or
[chunk x vocab] tensors; compiled, each chain is one or two fused kernels. Only the dims
that change with the row (tokens, positions) are compiled as symbolic sizes, so one graph
serves every row length and a relaunch with a new max_seq_len finds it in inductor's
on-disk cache instead of compiling again. The model's own sizes (hidden, heads, head_dim,
vocab) stay constants: with every size symbolic (dynamic=True) the kernels pay for index
arithmetic on sizes that never change (bench/islands.py measures it; docs/benchmarks.md,
"Compiled islands: which sizes are symbols").
CPU tensors (the tests, the demo) run the same functions eagerly.

A launch on CUDA also keeps what Dynamo traced (keep_traced_graphs): a relaunch, even at a
new max_seq_len, then loads the islands' graphs and guards instead of tracing them again,
which was most of its first step (docs/benchmarks.md, "The operator's loop").
"""
from __future__ import annotations

import functools
import itertools
import secrets
from collections.abc import Sequence

import torch
import torch._dynamo.bytecode_transformation as dynamo_bytecode

# One island serves several graphs: a norm of [B, L, H] activations and of [P, H] gathered
# positions, in bf16 and fp32, with and without gradient. fullgraph=True turns Dynamo's
# default limit of 8 recompilations per function into a hard error, hit by a process that
# both evaluates in fp32 and trains under bf16.
torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)


def compile_island(fn, varying: Sequence[Sequence[int]] = ()):
    """fn compiled with only its varying dims symbolic. varying[i]: the dims of positional
    argument i whose size changes from row to row (negative counts from the end); for an
    argument past its end, every dim but the last (the [..., features] layout of most
    islands)."""
    compiled = torch.compile(fn, fullgraph=True)

    def mark(args) -> None:
        for i, arg in enumerate(args):
            if isinstance(arg, torch.Tensor):
                dims = varying[i] if i < len(varying) else range(arg.dim() - 1)
                # "maybe": a dim of size 1 (one row per batch) is specialised, not an error
                torch._dynamo.maybe_mark_dynamic(arg, [d % arg.dim() for d in dims])

    def call(*args, **kwargs):
        return call_traced(compiled, lambda: mark(args), *args, **kwargs)
    return call


def call_traced(compiled, mark, *args, **kwargs):
    """compiled(*args, **kwargs) by a graph Dynamo holds already, else traced after mark()
    has marked the inputs' varying dims dynamic.

    Unmarked first: a graph traced from marked inputs serves unmarked ones, but a graph a
    previous launch saved (keep_traced_graphs) comes back guarding that the inputs carry
    no marks (torch 2.11-2.13 rebuild its guards from unmarked copies), so marked inputs
    would trace it again."""
    try:
        with torch.compiler.set_stance("fail_on_recompile"):
            return compiled(*args, **kwargs)
    except RuntimeError as error:
        if not str(error).startswith("Detected recompile"):
            raise
    mark()
    return compiled(*args, **kwargs)


def cuda_compiled(fn=None, *, varying: Sequence[Sequence[int]] = ()):
    """fn, compiled by compile_island (on first use) for CUDA tensors, eager for others."""
    if fn is None:
        return functools.partial(cuda_compiled, varying=varying)
    compiled = None

    @functools.wraps(fn)
    def call(*args, **kwargs):
        nonlocal compiled
        if not args[0].is_cuda:
            return fn(*args, **kwargs)
        if compiled is None:
            compiled = compile_island(fn, varying)
        return compiled(*args, **kwargs)
    call.varying = varying
    return call


def keep_traced_graphs() -> None:
    """Dynamo saves each traced function (its bytecode, guards and inductor's kernels) under
    inductor's cache directory when save_traced_graphs is called, and a later process loads
    it at the function's first call; a guard that fails there traces anew, as without it.
    Call before the first compile."""
    torch._dynamo.config.caching_precompile = True
    # A loaded function puts globals named from Dynamo's per-process counter into its
    # module (`__builtins_dict___0`, ...); a trace in this process, counting from 0 again,
    # then asserts that the name is taken (torch 2.11-2.13). A counter started at a random
    # point names nothing a saved process did.
    dynamo_bytecode._unique_id_counter = itertools.count(secrets.randbelow(1 << 48) << 8)


def save_traced_graphs() -> None:
    """Write what this process traced for later launches (keep_traced_graphs)."""
    torch.compiler.save_cache_artifacts()
