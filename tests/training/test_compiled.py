"""The CUDA trainer's compiled islands, compiled here for the CPU (inductor's C++ backend)
as cuda_compiled compiles them for CUDA: the same graphs must compute what the eager
functions compute, with one graph serving two row lengths (only the row's dims symbolic,
fullgraph: no silent fallback)."""
import pytest
import torch

from torch._dynamo.utils import counters

from training import fp8, layers
from training.drafters.eagle3 import loss, model
from training.compiled import compile_island
from training.config import PRESETS
from training.drafters.eagle3.probe import count_saved_bytes
from training.drafters.eagle3.memory import saved_per_token_step

L_FIRST, L_SECOND = 48, 80


def cases(L: int, g: torch.Generator) -> dict:
    def r(*shape, grad=True):
        return torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_(grad)
    return {
        "rms_norm": (layers.rms_norm, (r(1, L, 24), r(24), 1e-5)),
        # the embedding takes no gradient, the hidden state does
        "side_by_side_norms": (model.side_by_side_norms,
                               (r(1, L, 24, grad=False), r(1, L, 24), r(24), r(24), 1e-5)),
        "rope": (layers.rope, (r(1, L, 4, 16), *layers.rotary_tables(torch.arange(L)[None], 16,
                                                                 10000.0, torch.float64))),
        "norm_rope": (layers.norm_rope, (r(1, L, 4, 16), r(16), 1e-6,
                                         *layers.rotary_tables(torch.arange(L)[None], 16,
                                                               10000.0, torch.float64))),
        "swiglu": (layers.swiglu, (r(1, L, 40), r(1, L, 40))),
        "swiglu_backward": (layers.swiglu_backward, tuple(r(1, L, 40, grad=False) for _ in range(3))),
        "target_chunk": (loss._target_chunk, (r(L, 30, grad=False),)),
    }


@pytest.mark.slow
@pytest.mark.parametrize("name", ["rms_norm", "side_by_side_norms", "rope", "norm_rope",
                                  "swiglu", "swiglu_backward", "target_chunk"])
def test_compiled_island_equals_eager_at_two_lengths(name):
    g = torch.Generator().manual_seed(0)
    fn = cases(L_FIRST, g)[name][0]
    compiled = compile_island(fn.__wrapped__, fn.varying)
    graphs = []
    for L in (L_FIRST, L_SECOND):
        _, args = cases(L, g)[name]
        got, want = compiled(*args), fn.__wrapped__(*args)
        got = got if isinstance(got, tuple) else (got,)
        want = want if isinstance(want, tuple) else (want,)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
        if got[0].requires_grad:
            inputs = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
            weight = torch.rand_like(got[0])
            grads = torch.autograd.grad((got[0] * weight).sum(), inputs)
            expected = torch.autograd.grad((want[0] * weight).sum(), inputs)
            for a, b in zip(grads, expected):
                torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[1] == graphs[0], "the second row length compiled the island again"


def test_an_island_compiled_not_dynamic_keeps_every_size_but_the_varying_ones_a_constant():
    """A new width compiles a graph of its own (a constant size), where Dynamo's automatic
    dynamic shapes would serve every width after the second from one graph in which the
    width is a symbol; a new row length compiles nothing. The fp8 casts are so compiled."""
    assert fp8.to_fp8.dynamic is fp8.weights_to_fp8.dynamic is False
    island = compile_island(lambda t: t.abs().amax(), ((0,),), dynamic=False)
    graphs = []
    for rows, width in ((48, 64), (77, 64), (48, 96), (77, 96), (48, 128), (100, 128)):
        island(torch.randn(rows, width))
        graphs.append(counters["stats"]["unique_graphs"])
    assert [g - graphs[0] for g in graphs] == [0, 0, 1, 1, 2, 2]


@pytest.mark.slow
def test_compiled_input_norms_keep_the_modelled_bytes_and_copy_no_gradient():
    """The embedding's and the hidden state's norms as one island, in bf16 as on the GPU:
    they keep what the memory model says (each: its bf16 input and 1/rms), and backward
    takes the concatenation's gradient as it comes. Two compiled norms under a cat were
    handed strided halves of it and copied each first."""
    H, L = PRESETS["tiny"].hidden_size, 48
    g = torch.Generator().manual_seed(0)
    embeds, hidden = (torch.randn(1, L, H, generator=g).to(torch.bfloat16) for _ in range(2))
    hidden.requires_grad_()
    weights = [torch.randn(H, generator=g, requires_grad=True) for _ in range(2)]
    norms = compile_island(model.side_by_side_norms.__wrapped__)
    with count_saved_bytes(exclude=weights) as saved:
        x = norms(embeds, hidden, *weights, 1e-5)
    terms = saved_per_token_step(PRESETS["tiny"], "bf16")
    assert saved.nbytes == (terms["embed_norm"] + terms["hidden_norm"]) * L
    with torch.profiler.profile() as prof:
        torch.autograd.grad(x, [hidden, *weights], torch.randn_like(x))
    copies = [e.key for e in prof.key_averages() if e.key in ("aten::contiguous", "aten::clone")]
    assert copies == []


@pytest.mark.slow
def test_the_compiler_imported_meanwhile_is_there_for_the_first_compile(tmp_path):
    """A CUDA trainer imports the compiler on a thread while it starts. Here, in a fresh
    process, the thread imports inductor's modules while the real trainer starts and trains
    two steps on the CPU (its own imports, data and model beside the thread's), then a
    compile after the join uses them."""
    import subprocess
    import sys

    script = (
        "import sys, torch\n"
        "from training.cli import train_main\n"
        "from training.compiled import compile_island, compiler_imported, import_compiler_meanwhile\n"
        "assert 'torch._inductor.compile_fx' not in sys.modules\n"
        "import_compiler_meanwhile()\n"
        f"assert train_main(['--synthetic', '--preset', 'tiny', '--device', 'cpu', '--steps', '2', '--max-seq-len', '128',"
        f" '--ttt-steps', '2', '--out', {str(tmp_path / 'run')!r}]) == 0\n"
        "compiler_imported()\n"
        "assert 'torch._inductor.compile_fx' in sys.modules\n"
        "assert 'torch._inductor.codegen.cuda_combined_scheduling' in sys.modules\n"
        "x = torch.randn(3, 5)\n"
        "assert torch.equal(compile_island(lambda t: t * 2)(x), x * 2)\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]
