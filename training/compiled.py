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
"""
from __future__ import annotations

import functools
import threading
from collections.abc import Sequence

import torch
from torch.utils._pytree import tree_leaves

# One island serves several graphs: a norm of [B, L, H] activations and of [P, H] gathered
# positions, in bf16 and fp32, with and without gradient. fullgraph=True turns Dynamo's
# default limit of 8 recompilations per function into a hard error, hit by a process that
# both evaluates in fp32 and trains under bf16.
torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)


_meanwhile: list[threading.Thread] = []  # in the order begun; each waits for those before it


def import_compiler_meanwhile() -> None:
    """Import the compiler (inductor, its Triton code generation, Triton) on a thread, while
    this process waits for the run it replaces, sets up CUDA, reads its data and builds and
    resumes its model: the first compiled call would otherwise import it, some 600 modules,
    on the first step's clock. Joined before the first compile (`compiler_imported`)."""
    if not _meanwhile:
        after_compiler_imports(_import_compiler, "compiler-imports")


def after_compiler_imports(work, name: str) -> None:
    """Run `work` on a thread of its own once the threads begun before it are done (the
    compiler's imports first): the first compile waits for it too."""
    before = list(_meanwhile)

    def run() -> None:
        for thread in before:
            thread.join()
        work()
    thread = threading.Thread(target=run, name=name, daemon=True)
    _meanwhile.append(thread)
    thread.start()


def _import_compiler() -> None:
    try:
        import torch._inductor.codegen.cuda_combined_scheduling  # noqa: F401
        import torch._inductor.compile_fx  # noqa: F401
        import torch._inductor.runtime.triton_heuristics  # noqa: F401
    except Exception:  # the first compile imports them again, and says what fails
        pass


def compiler_imported() -> None:
    """Wait for the threads `import_compiler_meanwhile` and `after_compiler_imports` began:
    two threads importing the same modules at once could each meet the other's
    half-initialised ones, and a compile before the kept kernels are loaded would miss them."""
    for thread in list(_meanwhile):
        thread.join()


def compile_island(fn, varying: Sequence[Sequence[int]] = (), dynamic: bool | None = None):
    """fn compiled with only its varying dims symbolic. varying[i]: the dims of positional
    argument i whose size changes from row to row (negative counts from the end); for an
    argument past its end, every dim but the last (the [..., features] layout of most
    islands). dynamic=False: no other size is ever made symbolic. By default (None) Dynamo
    makes any size that differs from the last call's symbolic at the recompile (automatic
    dynamic shapes): an island called at several model sizes then serves all but the first
    from one graph in which they are symbols, and its whole-tensor reductions of symbolic
    size ran tens of times slower (the fp8 casts: docs/benchmarks.md, "Issue 45's targets",
    its paragraph "The fp8 casts' sizes")."""
    compiled = torch.compile(fn, fullgraph=True, dynamic=dynamic)

    def call(*args, **kwargs):
        for i, arg in enumerate(args):
            if isinstance(arg, torch.Tensor):
                dims = varying[i] if i < len(varying) else range(arg.dim() - 1)
                # "maybe": a dim of size 1 (one row per batch) is specialised, not an error
                torch._dynamo.maybe_mark_dynamic(arg, [d % arg.dim() for d in dims])
        return compiled(*args, **kwargs)
    return call


def cuda_compiled(fn=None, *, varying: Sequence[Sequence[int]] = (), dynamic: bool | None = None):
    """fn, compiled by compile_island (on first use) for CUDA tensors, eager for others: the
    device is the first argument's, or its first tensor's where it is a list of them."""
    if fn is None:
        return functools.partial(cuda_compiled, varying=varying, dynamic=dynamic)
    compiled = None

    @functools.wraps(fn)
    def call(*args, **kwargs):
        nonlocal compiled
        first = args[0] if isinstance(args[0], torch.Tensor) else tree_leaves(args[0])[0]
        if not first.is_cuda:
            return fn(*args, **kwargs)
        if compiled is None:
            compiler_imported()
            compiled = compile_island(fn, varying, dynamic)
        return compiled(*args, **kwargs)
    call.varying, call.dynamic = varying, dynamic
    return call
