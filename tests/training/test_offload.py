"""--offload-saved (training/offload.py): what backward keeps goes through host copies,
each tensor copied once however many nodes save it, and the step is the same step: the
same losses and gradients, recomputed TTT steps or not."""
from __future__ import annotations

import weakref

import pytest
import torch

from training import offload
from training.drafters.eagle3.step import Unroll, forward_backward
from training.offload import HostOffload
from training.packing import collate

TTT = 3


def grads(drafter):
    return [p.grad.clone() for p in drafter.parameters() if p.requires_grad]


@pytest.mark.parametrize("checkpoint", [0, TTT])
def test_an_offloaded_step_is_the_same_step(drafter, make_sample, monkeypatch, checkpoint):
    batch = collate([[make_sample(n, seed=i) for i, n in enumerate((30, 41))]], 80)
    unroll = Unroll(drafter)
    want_steps, _ = forward_backward(unroll, batch, TTT, 0.8, 16, checkpoint=checkpoint)
    want = grads(drafter)
    drafter.zero_grad(set_to_none=True)
    made = []

    def every_tensor(resident=()):  # the tiny drafter's tensors are all under the real floor
        made.append(HostOffload(min_bytes=0, resident=resident))
        return made[-1]
    monkeypatch.setattr("training.drafters.eagle3.step.HostOffload", every_tensor)
    got_steps, _ = forward_backward(unroll, batch, TTT, 0.8, 16, checkpoint=checkpoint,
                                    offload=True)
    [hooks] = made
    assert hooks.copies > 0, "nothing backward keeps went through the host"
    if checkpoint:  # step 2 and 3 both save step 1's keys and values: copied once
        assert hooks.saved > hooks.copies
    for a, b in zip(want_steps, got_steps, strict=True):
        torch.testing.assert_close(a.losses, b.losses, rtol=0, atol=0)
    for w, g in zip(want, grads(drafter), strict=True):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


def test_a_tensor_changed_in_place_after_its_save_is_copied_again():
    """The copy is found again only while the tensor holds what was copied."""
    hooks = HostOffload(min_bytes=0)
    x = torch.randn(8, requires_grad=True)
    with hooks:
        y = x * 1.0
        a = y.sin()  # saves y
        b = y.cos()  # saves y again: the same copy
        assert (hooks.saved, hooks.copies) == (2, 1)
        z = torch.randn(8)
        c = (x * z).sum()  # saves z
        assert hooks.copies == 2
        z.add_(1.0)  # its version moves on: the copy made is not what z holds now
        d = (x * z).sum()
        assert (hooks.saved, hooks.copies) == (4, 3)
    (a.sum() + b.sum() + c + d).backward()
    want = y.detach().cos() - y.detach().sin() + (z - 1.0) + z
    torch.testing.assert_close(x.grad, want)


def test_small_tensors_stay_where_they_are():
    hooks = HostOffload()
    x = torch.randn(4, requires_grad=True)
    with hooks:
        (x.sin()).sum().backward()
    assert hooks.copies == 0 and offload.MIN_BYTES >= 1 << 20


def test_a_saved_view_comes_back_with_its_strides():
    """Compiled backward graphs assert the strides of what they saved: a head-split view
    of token-major rows ([B, L, H, D] seen as [B, H, L, D]) must come back as it was."""
    hooks = HostOffload(min_bytes=0)
    x = torch.randn(2, 6, 4, 8, requires_grad=True)
    seen = []
    with hooks:
        q = x.transpose(1, 2)
        y = q.sin()  # saves the transposed view
    node = y.grad_fn
    saved = node._saved_self
    seen.append((saved.shape, saved.stride()))
    assert hooks.copies == 1
    assert seen == [(q.shape, q.stride())] and not q.is_contiguous()
    y.sum().backward()
    torch.testing.assert_close(x.grad, x.detach().cos())


def test_what_the_device_holds_anyway_is_not_copied():
    """The batch's tensors stay on the device through the step: a copy frees nothing."""
    batch_aux = torch.randn(4, 8)
    hooks = HostOffload(min_bytes=0, resident=(batch_aux,))
    w = torch.randn(8, 3, requires_grad=True)
    with hooks:
        y = (batch_aux @ w).sin()  # saves batch_aux (for w's gradient) and the product
    assert (hooks.saved, hooks.copies) == (1, 1)
    y.sum().backward()
    torch.testing.assert_close(w.grad, batch_aux.T @ (batch_aux @ w).detach().cos())



def test_no_copy_outlives_the_backward_that_used_it(monkeypatch):
    """Once backward has used a copy, nothing keeps it: not the hooks object, which
    outlives the step (its pack hook, one of its methods, holds it until a garbage
    collection)."""
    made = []

    class Tracked(offload._Host):
        def __init__(self, *args):
            super().__init__(*args)
            made.append(weakref.ref(self))
    monkeypatch.setattr(offload, "_Host", Tracked)
    hooks = HostOffload(min_bytes=0)
    x = torch.randn(16, requires_grad=True)
    with hooks:
        y = (x * 2.0).sin()  # sin saves its input
    assert len(made) == 1 and made[0]() is not None  # the graph holds it until backward
    y.sum().backward()
    assert made[0]() is None


def test_adamw_state_waits_in_host_buffers_between_steps_and_steps_the_same():
    """Three steps with the state moved out after each and back before the next give the
    weights three plain steps give; between steps the state is the host buffers, the same
    ones every step."""
    from training.offload import OptimizerOffload

    def run(offloaded: bool):
        torch.manual_seed(0)
        w = torch.nn.Parameter(torch.randn(16))
        optimizer = torch.optim.AdamW([w], lr=0.1)
        moving = OptimizerOffload(optimizer) if offloaded else None
        buffers = []
        for step in range(3):
            w.grad = torch.randn(16, generator=torch.Generator().manual_seed(step))
            if moving:
                moving.to_device()
                assert all(t is not b for t, b in zip(optimizer.state[w].values(), buffers))
            optimizer.step()
            if moving:
                moving.to_host()
                now = [t for t in optimizer.state[w].values() if torch.is_tensor(t)]
                assert not buffers or all(a is b for a, b in zip(now, buffers))
                buffers = now
        return w.detach()
    torch.testing.assert_close(run(True), run(False), rtol=0, atol=0)
