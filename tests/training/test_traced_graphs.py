"""What Dynamo traced in one launch serves the next (training/compiled.py): real processes,
real torch.compile (inductor's C++ backend here, Triton on the device machine), inductor's
cache in a temporary directory."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# One launch: the RMS norm island at a row length, 3-D ([1, L, H], with a gradient) and,
# when asked, 2-D ([P, H]: a variant the saved launch may not hold); checked against its
# eager self; what it traced counted; saved for the next launch.
CHILD = """
import json, sys
import torch
from torch._dynamo.utils import counters
from training import compiled
from training.model import rms_norm

L, variants, keep, device = int(sys.argv[1]), sys.argv[2].split(","), sys.argv[3] == "keep", sys.argv[4]
if keep:
    compiled.keep_traced_graphs()
norm = compiled.compile_island(rms_norm.__wrapped__)
g = torch.Generator().manual_seed(L)
w = torch.randn(64, generator=g).to(device)
traced = {}
for variant in variants:
    shape = (1, L, 64) if variant == "3d" else (L // 3, 64)
    x = torch.randn(*shape, generator=g).to(device).requires_grad_()
    before = counters["stats"]["unique_graphs"]
    got = norm(x, w, 1e-6)
    got.sum().backward()
    grad, x.grad = x.grad, None
    want = rms_norm.__wrapped__(x, w, 1e-6)
    want.sum().backward()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(grad, x.grad, rtol=1e-4, atol=1e-5)
    traced[variant] = counters["stats"]["unique_graphs"] - before
if keep:
    compiled.save_traced_graphs()
print(json.dumps(traced))
"""


def launch(cache: Path, device: str, length: int, variants: str, keep: bool = True) -> dict:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache), "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", CHILD, str(length), variants,
                             "keep" if keep else "plain", device],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_new_launch_at_a_new_length_loads_the_traced_graphs_instead_of_tracing(tmp_path, device):
    cache = tmp_path / "inductor"
    assert launch(cache, device, 96, "3d") == {"3d": 1}  # the first launch traces
    # Without the saved graphs a launch at a new length traces again, even with the
    # kernels in inductor's cache: what keep_traced_graphs saves.
    assert launch(cache, device, 150, "3d", keep=False) == {"3d": 1}
    # A new length: loaded, nothing traced. A variant the first launch never ran traces
    # in the process that loaded the others (this asserted on a name taken by the load,
    # before keep_traced_graphs moved Dynamo's counter), and is saved in turn.
    assert launch(cache, device, 200, "3d,2d") == {"3d": 0, "2d": 1}
    assert launch(cache, device, 333, "2d,3d") == {"2d": 0, "3d": 0}


FLEX_CHILD = """
import sys, torch
from training import compiled
from training.attention import DocLayout, compiled_flex
compiled.keep_traced_graphs()
L = int(sys.argv[1])
g = torch.Generator().manual_seed(L)
layout = DocLayout(torch.zeros(1, L, dtype=torch.long), use_flex=True)
q, k, v = (torch.randn(1, h, L, 16, generator=g) for h in (4, 2, 2))
compiled_flex()(q, k, v, block_mask=layout.mask(1), enable_gqa=True)
compiled.save_traced_graphs()
"""


@pytest.mark.slow
def test_flex_compiles_in_a_launch_after_one_that_saved_its_graphs(tmp_path):
    """Flex is traced by each launch: a saved flex failed to load (an assertion in torch's
    package code, the trainer's first step dead on it)."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(REPO)}
    for length in (256, 384):
        result = subprocess.run([sys.executable, "-c", FLEX_CHILD, str(length)], cwd=REPO,
                                env=env, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
