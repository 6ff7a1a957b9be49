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
from training.fp8 import (E4M3, Fp8Weight, fp8_linear, linear_backward, matmul, scaled,
                          transposed)


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


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary embedding of x [B, L, heads, D] by rotary_tables (half-split layout)."""
    x1, x2 = x.to(cos.dtype).chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


@cuda_compiled(varying=((-3,), (-3,), (-3,)))
def rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    return rotate(x, cos, sin)


@cuda_compiled(varying=((-3,), (), (), (-3,), (-3,)))
def norm_rope(x: Tensor, weight: Tensor, eps: float, cos: Tensor, sin: Tensor) -> Tensor:
    """rope of the per-head RMS norm of x [B, L, heads, D] (a Qwen3 layer's q and k), in
    one island: as two, each would cost the CPU a call of its own forward and backward, on
    a step whose GPU waits on the CPU queueing its kernels. Keeps what the two would:
    x and 1/rms."""
    return rotate(normalise(x, weight, eps), cos, sin)


def _as_read(weight: Tensor) -> Tensor:
    """weight cast to autocast's dtype, where autocast is on."""
    device = weight.device.type
    if torch.is_autocast_enabled(device):
        return weight.to(torch.get_autocast_dtype(device))
    return weight


class MLP(nn.Module):
    """fp8: its three projections as fp8 matmuls (training/fp8.py), gate and up as one."""

    def __init__(self, cfg: DrafterConfig | DFlashConfig, fp8: bool = False):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.fp8 = fp8

    def fp8_groups(self) -> list[tuple[Tensor, ...]]:
        """Its weights as fp8_weights takes them: gate and up stacked (one matmul of x, one
        cast of its gradient), and down."""
        return [(self.gate_proj.weight, self.up_proj.weight), (self.down_proj.weight,)]

    def unroll_weights(self) -> Tensor:
        """bf16: down_proj's weight as forward reads it, made once for a whole TTT unroll:
        cast to autocast's dtype, as autocast does for the other projections. Given the
        fp32 weight, SwiGLUDown (a Function: autocast's cache does not reach its backward)
        would cast it again in every step's backward and hand back an fp32 gradient per
        step to add: a [hidden x intermediate] copy per TTT step, where one cast and one
        gradient serve the unroll (docs/benchmarks.md, "down_proj cast once per unroll").
        fp8 reads fp8_groups() through fp8_weights instead, made by the drafter with its
        other projections' in one call."""
        return _as_read(self.down_proj.weight)

    def forward(self, x: Tensor, weights: Tensor | tuple[Fp8Weight, ...]) -> Tensor:
        """weights: unroll_weights() in bf16; in fp8, fp8_groups()' Fp8Weights."""
        if self.fp8:
            gate_up, down = weights
            return SwiGLUDownFp8.apply(fp8_linear(x, gate_up), down, *down.parts)
        return SwiGLUDown.apply(self.gate_proj(x), self.up_proj(x), weights)


@cuda_compiled
def swiglu(gate: Tensor, up: Tensor) -> Tensor:
    return F.silu(gate) * up


@cuda_compiled
def swiglu_backward(gate: Tensor, up: Tensor, grad: Tensor) -> tuple[Tensor, Tensor]:
    return swiglu_grads(gate, up, grad)


def swiglu_grads(gate: Tensor, up: Tensor, grad: Tensor) -> tuple[Tensor, Tensor]:
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


@cuda_compiled
def swiglu_to_fp8(gate_up: Tensor) -> tuple[Tensor, Tensor]:
    """silu(gate) * up of [tokens x (gate ; up)] in e4m3, and its inverse scale."""
    gate, up = gate_up.float().chunk(2, dim=-1)
    values, inverse = scaled(F.silu(gate) * up, E4M3)
    return values.to(E4M3), inverse


@cuda_compiled
def swiglu_to_fp8_t(gate_up: Tensor) -> tuple[Tensor, Tensor]:
    """swiglu_to_fp8's, transposed (fp8.transposed)."""
    gate, up = gate_up.float().chunk(2, dim=-1)
    values, inverse = scaled(F.silu(gate) * up, E4M3)
    return transposed(values, E4M3), inverse


@cuda_compiled
def swiglu_backward_stacked(gate_up: Tensor, grad: Tensor) -> Tensor:
    """swiglu_backward's gradients of gate and up, written side by side as gate_up is."""
    return torch.cat(swiglu_grads(*gate_up.chunk(2, dim=-1), grad), dim=-1)


class SwiGLUDownFp8(torch.autograd.Function):
    """SwiGLUDown as fp8 matmuls, of gate and up stacked [tokens x (gate ; up)] (one
    tensor: the stacked matmul's output, and the gradient it takes back), for the
    Fp8Weight `w` of down_proj; `parts` are w.parts, for the gradient's way back. As
    SwiGLUDown, backward recomputes silu(gate) * up (in fp8, transposed, as the weight
    gradient reads it) rather than keeping it through every TTT step."""

    @staticmethod
    def forward(ctx, gate_up: Tensor, w: Fp8Weight, *parts: Tensor) -> Tensor:
        ctx.save_for_backward(gate_up, w.data_t, w.inverse)
        ctx.weight_dtype = parts[0].dtype
        h, inverse = swiglu_to_fp8(gate_up.flatten(0, -2))
        return matmul(h, inverse, w.data, w.inverse, gate_up.dtype).view(
            *gate_up.shape[:-1], -1)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:
        gate_up, w_t, w_inverse = ctx.saved_tensors
        flat = gate_up.flatten(0, -2)
        h_t, inverse = swiglu_to_fp8_t(flat)
        grad_h, grad_w = linear_backward(grad.flatten(0, -2), h_t, inverse, w_t, w_inverse,
                                         (gate_up.dtype, ctx.weight_dtype))
        del h_t  # not held beside the [tokens x 2 intermediate] gradient below
        return swiglu_backward_stacked(flat, grad_h).view_as(gate_up), None, grad_w
