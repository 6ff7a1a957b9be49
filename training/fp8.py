"""fp8 matmuls with dynamic tensorwise scaling (`train --fp8`): the drafters' layers run
their attention's and MLP's projections (training/layers.py, training/drafters/*/model.py)
on the fp8 tensor cores of Ada, Hopper and newer, whose fp8 rate is twice their bf16 rate.

Each operand is cast to fp8 at one scale for the whole tensor, taken from its own largest
magnitude at the time (no history to go stale when the weights or the loss move): that
magnitude maps to fp8's largest value, so nothing overflows and fp8's exponent range
covers the rest. Activations and weights are cast to e4m3 (more mantissa), gradients to
e5m2 (more range). torch._scaled_mm multiplies the fp8 operands, accumulates in fp32 and
scales back into the activations' dtype (bf16 under autocast, fp32 on the CPU, whose
runs are the tests). cuBLAS takes A row-major and B column-major with the summed dimension
a multiple of 16: every matmul here is A @ Bᵀ of two row-major [rows x summed] tensors,
and the token dimension, summed only by the weight's gradient, is padded with zeros.
"""
from __future__ import annotations

import weakref
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from training.compiled import cuda_compiled

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
MIN_CAPABILITY = (8, 9)  # the first tensor cores with fp8 (Ada); Hopper is 9.0
ALIGN = 16  # what cuBLAS's fp8 matmuls want of the summed and the output dimensions
# The smallest magnitude a tensor's scale is taken from: an all-zero tensor (a gradient
# that is zero) would divide by zero, and fp8's largest over this stays a finite fp32.
AMAX_FLOOR = 1e-30


def refusal(capability: tuple[int, int] | None, shape) -> str | None:
    """Why fp8 matmuls cannot run a drafter of `shape` (hidden_size, intermediate_size)
    on a CUDA card of compute capability `capability` (None: the CPU), or None."""
    if capability is not None and tuple(capability) < MIN_CAPABILITY:
        return ("fp8 matmuls need a card of compute capability {}.{} or newer (H100, H200, "
                "L40S, …); this one's is {}.{}".format(*MIN_CAPABILITY, *capability))
    widths = {"hidden_size": shape.hidden_size, "intermediate_size": shape.intermediate_size,
              "num_heads × head_dim": shape.num_heads * shape.head_dim,
              "num_kv_heads × head_dim": shape.num_kv_heads * shape.head_dim}
    odd = [f"{name} {width}" for name, width in widths.items() if width % ALIGN]
    if odd:
        return f"fp8 matmuls need sizes that are multiples of {ALIGN}: {', '.join(odd)}"
    return None


def scaled(t: Tensor, dtype: torch.dtype, largest: Tensor | None = None
           ) -> tuple[Tensor, Tensor]:
    """t in fp32 multiplied by its scale (the largest magnitude to dtype's largest value:
    t's own, or `largest` where t is one of several tensors cast at one scale) and clamped
    to dtype's range, and the scale's inverse: what _scaled_mm multiplies the product by.
    The clamp keeps rounding at the top from overflowing."""
    top = torch.finfo(dtype).max
    largest = t.abs().amax() if largest is None else largest
    scale = top / largest.float().clamp(min=AMAX_FLOOR)
    return (t.float() * scale).clamp(-top, top), scale.reciprocal()


def transposed(t: Tensor, dtype: torch.dtype) -> Tensor:
    """[rows x cols] scaled values as fp8 [cols x rows padded to ALIGN], contiguous: the
    weight gradient's operand, which sums over the rows (tokens). Padded before the
    cast, where padding is plain fp32; contiguous said outright, as a pad of nothing keeps
    the transposed strides."""
    return F.pad(t.t(), (0, -t.shape[0] % ALIGN)).to(dtype,
                                                       memory_format=torch.contiguous_format)


# The casts are called at many widths (each projection's input, output gradient and
# weight): dynamic=False keeps every size but the rows a constant (compile_island).
@cuda_compiled(dynamic=False)
def to_fp8(t: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
    """t [tokens x features] in fp8 as a matmul's A, as the weight gradient's (transposed),
    and its inverse scale."""
    values, inverse = scaled(t, dtype)
    return values.to(dtype), transposed(values, dtype), inverse


@cuda_compiled(dynamic=False)
def rows_to_fp8(t: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """t [rows x features] in fp8 as a matmul's A alone (no weight gradient reads it
    transposed: a frozen head's), and its inverse scale."""
    values, inverse = scaled(t, dtype)
    return values.to(dtype), inverse


@cuda_compiled(varying=((),), dynamic=False)
def frozen_to_fp8(weight: Tensor) -> tuple[Tensor, Tensor]:
    """A frozen weight [out x in] as only its input's gradient reads it: transposed
    [in x out] in e4m3, contiguous, and its inverse scale."""
    values, inverse = scaled(weight, E4M3)
    return values.t().contiguous().to(E4M3), inverse


class FrozenFp8:
    """frozen_to_fp8 of a frozen weight (a verifier's head), made once for each weight it
    is given, and again if that weight's values or place change (a device move swaps a
    parameter's data, a checkpoint's load copies into it): a cast each step would cost a
    pass over the weight."""

    def __init__(self):
        self._made_from, self._key, self._made = (lambda: None), None, None

    def __call__(self, weight: Tensor) -> tuple[Tensor, Tensor] | None:
        """None where cuBLAS cannot take the weight's out dimension (the matmul's summed
        one: a vocabulary) as fp8: the gradient then stays in the activations' dtype."""
        if weight.shape[0] % ALIGN:
            return None
        key = weight.data_ptr(), weight.device, weight.dtype, weight._version
        if self._made_from() is not weight or self._key != key:
            self._made = None  # not held beside the new copy
            self._made = frozen_to_fp8(weight)
            self._made_from, self._key = weakref.ref(weight), key
        return self._made


@cuda_compiled(dynamic=False)
def weights_to_fp8(groups: list[tuple[Tensor, ...]]) -> list[tuple[Tensor, Tensor, Tensor]]:
    """Each group of weights [out_i x in], stacked along out, in e4m3 at one scale for the
    group; transposed [in x out] (the input gradient's B, contiguous); and its inverse
    scale. One call for every group: each call of a compiled function costs the CPU a
    guard check and a launch of its own, and a step's casts would otherwise keep the GPU
    waiting on them."""
    made = []
    for group in groups:
        largest = torch.stack([w.abs().amax() for w in group]).amax()
        parts = [scaled(w, E4M3, largest) for w in group]  # each with the group's inverse
        values, inverse = torch.cat([v for v, _ in parts]), parts[0][1]
        made.append((values.to(E4M3), values.t().contiguous().to(E4M3), inverse))
    return made


class Fp8Weight(NamedTuple):
    """Weights as the fp8 matmuls read them, stacked along their outputs where they share
    an input (one matmul of it, one cast of its gradient): made once for a whole TTT unroll
    or a whole step (fp8_weights), as each matmul's own casts would cost a pass over the
    weights each."""
    parts: tuple[Tensor, ...]  # the parameters: the gradient is split among them
    data: Tensor  # e4m3 [out x in]
    data_t: Tensor  # e4m3 [in x out], contiguous
    inverse: Tensor  # of its scale


def fp8_weights(users: list[list[tuple[Tensor, ...]]]) -> list[tuple[Fp8Weight, ...]]:
    """For each user (a module's list of groups of parameters, a group's several stacked),
    its Fp8Weights, every user's made in one call (weights_to_fp8). The parameters are
    read as they are (fp32 under autocast too): one rounding, to e4m3, and the gradient
    comes back in their dtype."""
    with torch.no_grad():  # the gradient reaches the parameters through Fp8Weight.parts
        made = iter(weights_to_fp8([group for groups in users for group in groups]))
    return [tuple(Fp8Weight(group, *next(made)) for group in groups) for groups in users]


def matmul(a: Tensor, a_inverse: Tensor, b: Tensor, b_inverse: Tensor,
           dtype: torch.dtype, out: Tensor | None = None) -> Tensor:
    """a @ bᵀ in dtype, of fp8 a [M x K] and b [N x K], both row-major; written into `out`
    (contiguous [M x N]) where given."""
    return torch._scaled_mm(a, b.t(), scale_a=a_inverse, scale_b=b_inverse, out_dtype=dtype,
                            out=out)


def linear_backward(grad: Tensor, x_t: Tensor, x_inverse: Tensor, w_t: Tensor,
                    w_inverse: Tensor, dtypes: tuple[torch.dtype, torch.dtype]
                    ) -> tuple[Tensor, Tensor]:
    """The gradients of x @ Wᵀ for the output's grad [tokens x out]: x's (grad @ W) and
    W's (gradᵀ @ x), in dtypes (x's, W's). x_t, x_inverse: x as to_fp8 made it; w_t,
    w_inverse: Fp8Weight's data_t and inverse."""
    g, g_t, g_inverse = to_fp8(grad, E5M2)
    grad_x = matmul(g, g_inverse, w_t, w_inverse, dtypes[0])
    return grad_x, matmul(g_t, g_inverse, x_t, x_inverse, dtypes[1])


def input_grad(grad: Tensor, weight: Tensor, frozen: tuple[Tensor, Tensor] | None,
               out: Tensor) -> None:
    """out = grad [rows x out] @ weight, the input's gradient: an fp8 matmul (grad in
    e5m2) where `frozen` is given (a frozen weight as FrozenFp8 made it), else in weight's
    dtype."""
    if frozen is None:
        torch.mm(grad, weight, out=out)
        return
    g, g_inverse = rows_to_fp8(grad, E5M2)
    matmul(g, g_inverse, *frozen, out.dtype, out=out)


class Fp8Linear(torch.autograd.Function):
    """x @ Wᵀ in fp8, for an Fp8Weight `w`; `parts` are w.parts, passed on their own so the
    gradient reaches them (their values are not read, nor kept). Keeps x in fp8 for
    backward: half the bytes of bf16."""

    @staticmethod
    def forward(ctx, x: Tensor, w: Fp8Weight, *parts: Tensor) -> Tensor:
        x8, x_t, x_inverse = to_fp8(x.flatten(0, -2), E4M3)
        ctx.save_for_backward(x_t, x_inverse, w.data_t, w.inverse)
        ctx.dtypes, ctx.sizes = (x.dtype, parts[0].dtype), [p.shape[0] for p in parts]
        return matmul(x8, x_inverse, w.data, w.inverse, x.dtype).view(*x.shape[:-1], -1)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:
        grad_x, grad_w = linear_backward(grad.flatten(0, -2), *ctx.saved_tensors, ctx.dtypes)
        return grad_x.view(*grad.shape[:-1], -1), None, *grad_w.split(ctx.sizes)


def fp8_linear(x: Tensor, w: Fp8Weight) -> Tensor:
    return Fp8Linear.apply(x, w, *w.parts)
