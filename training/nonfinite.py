"""A step whose loss or gradient is not finite is never applied.

One NaN update poisons every weight it touches, and every step after it is NaN for good
(issue 45: kimi-k2 at 92,160 trained NaN from step 2 on). So the loop asks, between the
backward and the optimizer's step, whether this step's loss and gradient norm are finite;
where not, the gradients are dropped and neither the optimizer nor the schedule moves
(the batch is consumed: the next step trains on the next one). Each skipped step is a
`nonfinite` event; `max_in_a_row` of them in a row end the run (status "nonfinite", exit
EXIT_NONFINITE) with the weights of its last applied step, which is what it saves.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from training.distributed import sum_over_ranks
from training.drafters.drafter import Scored

LOSS, GRAD_NORM = "loss", "grad_norm"  # the `nonfinite` event's `what`


class Verdict:
    """optimizer_step's `apply` for one step: whether to apply it, given its gradient norm.
    `what` then names what was not finite (the loss first), or None.

    The check is the step's one read from the device, and it reads with it what the step's
    event reports: each unit's loss and agreement sums (`sums`, summed over the ranks: the
    units' losses, then their agreements) and the gradient norm (`grad_norm`). Nothing is
    then read after the optimizer is queued (the loop sums its host values over the ranks
    on the host), so the CPU goes on to queue the next step while the GPU runs it."""

    def __init__(self, scored: Sequence[Scored], world: int):
        self.scored, self.world = scored, world
        self.what: str | None = None
        self.sums: list[float] = []
        self.grad_norm = float("nan")

    def __call__(self, grad_norm: Tensor) -> bool:
        sums = ([s.losses.sum() for s in self.scored]
                + [s.agree.sum().double() for s in self.scored])
        loss = torch.stack(sums[:len(self.scored)]).sum() if self.scored else None
        checks = [grad_norm] if loss is None else [loss, grad_norm]
        bad = [(~torch.isfinite(t.float())).double() for t in checks]
        # Summed over the ranks: every rank skips the same steps (a loss is per rank; the
        # norm is the whole drafter's already, and stays out of the sum).
        summed = sum_over_ranks(torch.stack([*bad, *(t.double() for t in sums)]), self.world)
        read = torch.cat([summed, grad_norm.detach().double().reshape(1)]).tolist()
        flags = read[:len(bad)] if loss is not None else [0.0, read[0]]
        self.sums, self.grad_norm = read[len(bad):-1], read[-1]
        self.what = LOSS if flags[0] else GRAD_NORM if flags[1] else None
        return self.what is None


class Streak:
    """Skipped steps in a row; `over` once there have been `max_in_a_row` of them."""

    def __init__(self, max_in_a_row: int):
        if max_in_a_row < 1:
            raise ValueError(f"max_in_a_row must be at least 1, got {max_in_a_row}")
        self.max_in_a_row, self.in_a_row = max_in_a_row, 0

    def skipped(self) -> int:
        self.in_a_row += 1
        return self.in_a_row

    def applied(self) -> None:
        self.in_a_row = 0

    @property
    def over(self) -> bool:
        return self.in_a_row >= self.max_in_a_row
