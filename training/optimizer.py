"""The optimizer a drafter trains with: AdamW (fused on CUDA), its warmup and cosine
schedule, and the clipped step. A training step is a drafter's forward_backward
(training/drafters/) then `optimizer_step`: two functions, because `trackside fit
--probe` measures the peak memory of each phase on its own."""
from __future__ import annotations

import math
from collections.abc import Callable

import torch

# Where a run names none (TrainConfig's defaults; `fit --probe` steps as a run would).
LR = 1e-4  # AdamW's peak rate
GRAD_CLIP = 1.0  # the gradient's largest norm


def warmup_cosine(warmup: int, total: int, floor: float = 0.1):
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
    return factor


def _folds_clip(optimizer: torch.optim.Optimizer) -> bool:
    """Whether optimizer takes GradScaler's grad_scale (torch's fused Adam and AdamW; a
    private attribute, so its absence means the plain clip, never no clip)."""
    return (getattr(optimizer, "_step_supports_amp_scaling", False)
            and hasattr(torch.nn.utils, "get_total_norm"))  # torch >= 2.6


def make_optimizer(params, lr: float, device: torch.device,
                   weight_decay: float = 0.0) -> torch.optim.AdamW:
    return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=weight_decay,
                             fused=device.type == "cuda")


def optimizer_step(optimizer: torch.optim.Optimizer, params, grad_clip: float,
                   apply: Callable[[torch.Tensor], bool] | None = None) -> torch.Tensor:
    """Clip, step, drop the gradients; returns the norm before clipping. `apply`, given
    the norm, can refuse the step (training/nonfinite.py): the gradients are dropped and
    nothing is applied."""
    params = list(params)
    grads = [p.grad for p in params if p.grad is not None]
    # sharded gradients (DTensors) take clip_grad_norm_, which reduces the norm over ranks
    if _folds_clip(optimizer) and not any(hasattr(g, "full_tensor") for g in grads):
        grad_norm = torch.nn.utils.get_total_norm(grads)
        if apply is None or apply(grad_norm):
            # Fused AdamW divides every gradient by grad_scale as it reads them (the
            # protocol torch.amp.GradScaler drives), so the clip costs no pass of its own
            # over the gradients. clip_grad_norm_ scales by grad_clip / (norm + 1e-6) when
            # below 1.
            optimizer.grad_scale = ((grad_norm + 1e-6) / grad_clip).clamp(min=1.0)
            try:
                optimizer.step()
            finally:
                del optimizer.grad_scale
    else:
        grad_norm = torch.nn.utils.clip_grad_norm_(params, grad_clip)
        if apply is None or apply(_whole(grad_norm)):
            optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return _whole(grad_norm)


def _whole(grad_norm: torch.Tensor) -> torch.Tensor:
    # Sharded gradients give a DTensor norm, already reduced over the ranks: its value is
    # the whole drafter's norm, as DDP's is.
    return grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
