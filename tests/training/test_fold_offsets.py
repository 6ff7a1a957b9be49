"""The diagonal-key fold's Triton kernels at a stack of keys past 2^31 elements.

kimi-k2 (64 KV heads, head_dim 128) at 92,160 × TTT 5 stacks 4 diagonal keys of 755M
elements each: the kernels' `s * distance` in int32 wrapped at the fourth and read memory
before the stack, and the run trained NaN. The fold is the same per row, so the kernels'
output on a few rows of the whole stack is checked against the torch fold on those rows
alone (a small stack, no large offsets).
"""
from __future__ import annotations

import pytest
import torch


@pytest.mark.gpu
def test_triton_fold_past_2_31_elements_matches_the_torch_fold_on_its_rows():
    from training.drafters.eagle3 import attention, fold_triton
    B, H, L, D, S = 1, 64, 92160, 128, 4  # kimi-k2's last TTT step at 92,160 × 5
    assert (S - 1) * B * H * L * D >= 2**31  # the last key starts past int32
    g = torch.Generator(device="cuda").manual_seed(0)

    def rand(*shape, kind=torch.bfloat16):
        return torch.randn(*shape, generator=g, device="cuda", dtype=kind)
    q, out, grad = (rand(B, L, H, D).transpose(1, 2) for _ in range(3))
    lse = rand(B, H, L, kind=torch.float32)
    keys, values = rand(S, B, H, L, D), rand(S, B, H, L, D)
    got_o, got_p = fold_triton.fold_forward(q, out, lse, keys, values)
    got = fold_triton.fold_backward(grad, q, out, got_p, keys, values)
    tol = dict(rtol=2e-2, atol=2e-2)
    for rows in (slice(0, 64), slice(L // 2, L // 2 + 64), slice(L - 64, L)):
        def at(t, dim):
            return t[(slice(None),) * dim + (rows,)]
        want_o, want_p = attention._fold_forward(at(q, 2), at(out, 2), at(lse, 2),
                                                 at(keys, 3), at(values, 3))
        torch.testing.assert_close(at(got_o, 2).float(), want_o.float(), **tol)
        torch.testing.assert_close(at(got_p, 4), want_p, rtol=1e-5, atol=1e-6)
        want = attention._fold_backward(at(grad, 2), at(q, 2), at(out, 2), want_p,
                                        at(keys, 3), at(values, 3))
        dims = (2, 2, 2, 3, 3)  # d_q, d_out, d_lse, d_keys, d_values: where L is
        for name, a, b, dim in zip(("q", "out", "lse", "keys", "values"), got, want, dims,
                                   strict=True):
            assert torch.isfinite(at(a, dim)).all(), f"d_{name} is not finite"
            torch.testing.assert_close(at(a, dim).float(), b.float(), **tol,
                                       msg=lambda m, name=name: f"d_{name}: {m}")
