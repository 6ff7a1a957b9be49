"""The layers both drafters are built of: RMSNorm, rotary embedding, the SwiGLU MLP
(training/drafters/eagle3/model.py's one layer, training/drafters/dflash/model.py's
several)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from training.compiled import cuda_compiled
from training.config import DFlashConfig, DrafterConfig
from training.flex import at_least_float32


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps)


def normalise(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    xf = x.to(at_least_float32(x.dtype))
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * weight.to(xf.dtype)).to(x.dtype)


@cuda_compiled
def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return normalise(x, weight, eps)


def rotary_tables(positions: Tensor, head_dim: int, theta: float,
                  dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos and sin of the rotary angles at positions [B, L], [B, L, 1, head_dim / 2] each.
    Made once per TTT step for both q and k: computed inside rope, the transcendentals ran
    per head and per rotated tensor (docs/benchmarks.md, "RoPE from per-step tables")."""
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, device=positions.device,
                                       dtype=dtype) / head_dim)
    angles = positions[:, :, None, None].to(dtype) * inv_freq
    return angles.cos(), angles.sin()


@cuda_compiled(varying=((-3,), (-3,), (-3,)))
def rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary embedding of x [B, L, heads, D] by rotary_tables (half-split layout)."""
    x1, x2 = x.to(cos.dtype).chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


class MLP(nn.Module):
    def __init__(self, cfg: DrafterConfig | DFlashConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def down_weight(self) -> Tensor:
        """down_proj's weight as the matmuls read it, cast to autocast's dtype once for a
        whole TTT unroll, as autocast does for the other projections. Given the fp32
        weight, SwiGLUDown (a Function: autocast's cache does not reach its backward) would
        cast it again in every step's backward and hand back an fp32 gradient per step to
        add: a [hidden x intermediate] copy per TTT step, where one cast and one gradient
        serve the unroll (docs/benchmarks.md, "down_proj cast once per unroll")."""
        weight, device = self.down_proj.weight, self.down_proj.weight.device.type
        if torch.is_autocast_enabled(device):
            return weight.to(torch.get_autocast_dtype(device))
        return weight

    def forward(self, x: Tensor, down_weight: Tensor) -> Tensor:
        """down_weight: down_weight(), made once per unroll."""
        return SwiGLUDown.apply(self.gate_proj(x), self.up_proj(x), down_weight)


@cuda_compiled
def swiglu(gate: Tensor, up: Tensor) -> Tensor:
    return F.silu(gate) * up


@cuda_compiled
def swiglu_backward(gate: Tensor, up: Tensor, grad: Tensor) -> tuple[Tensor, Tensor]:
    g = gate.to(at_least_float32(gate.dtype))
    sig = torch.sigmoid(g)
    grad = grad.to(g.dtype)
    grad_up = grad * g * sig
    grad_gate = grad * up.to(g.dtype) * sig * (1 + g * (1 - sig))
    return grad_gate.to(gate.dtype), grad_up.to(up.dtype)


class SwiGLUDown(torch.autograd.Function):
    """down_proj(silu(gate) * up), keeping only gate and up for backward: silu(gate) * up,
    the [tokens x intermediate] input of down_proj's weight gradient, is recomputed there
    (one elementwise pass) instead of kept through every TTT step (a third of the MLP's
    saved bytes, the largest term of a step's activations)."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda")
    def forward(ctx, gate: Tensor, up: Tensor, weight: Tensor) -> Tensor:
        ctx.save_for_backward(gate, up, weight)
        return F.linear(swiglu(gate, up), weight)

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")  # backward's matmuls in forward's autocast
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        gate, up, weight = ctx.saved_tensors
        h = swiglu(gate, up)
        grad_weight = grad.flatten(0, -2).T @ h.flatten(0, -2)
        del h  # not held beside the three [tokens x intermediate] gradients below
        grad_gate, grad_up = swiglu_backward(gate, up, grad @ weight)
        return grad_gate, grad_up, grad_weight
