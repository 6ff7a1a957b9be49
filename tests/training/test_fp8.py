"""fp8 matmuls (training/fp8.py) on the CPU, real torch._scaled_mm: against float64 within
fp8's rounding, the MLP and each drafter in fp8 against their float64 twins, `train --fp8`
end to end, and where --fp8 is refused.

Tolerances. e4m3 keeps 3 mantissa bits, e5m2 2: rounding random normal data to the
nearest is off by a relative ~2.6 % (e4m3) and ~5.2 % (e5m2) RMS. A product of two
rounded operands adds their errors in quadrature, and over a sum of many such products
the error relative to the result's norm stays that RMS: ~3.7 % forward (e4m3 x e4m3) and
~5.8 % for the gradients (an e5m2 gradient times an e4m3 operand), as measured here. A
scale inverted or an operand transposed wrong is off by far more at any magnitude, a scale
left out at magnitudes outside fp8's range (each broken once to see these tests fail);
bf16 is off by 0.3 %, under the lower bound that says fp8 ran.
"""
from __future__ import annotations

import json

import pytest
import torch

from torch._dynamo.utils import counters

from training import fp8, layers
from training.cli import main
from training.compiled import compile_island
from training.config import DFLASH_PRESETS, PRESETS
from training.drafters.dflash.model import DFlashDrafter
from training.drafters.eagle3.model import Eagle3Drafter
from training.drafters.measured import shape_from_start
from training.fp8 import fp8_linear, fp8_weights
from training.layers import MLP
from training.packing import collate
from tests.training.test_dflash import tiny_drafter_and_rows

FORWARD, GRADIENT = 0.05, 0.08  # fp8's expected 3.7 % and 5.8 %, with room (docstring)


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want).norm() / want.norm()).item()


# Magnitudes (of x, of W, of the output's gradient) far from fp8's range: at 1e-7 an
# unscaled e5m2 gradient is all zeros, at 1e3 an unscaled e4m3 x saturates at 448.
@pytest.mark.parametrize("x_size, w_size, grad_size", [(1, 1, 1), (1e3, 0.02, 1e-7),
                                                       (1e-3, 30, 1e4)])
def test_an_fp8_matmul_and_its_gradients_are_float64s_within_fp8s_rounding(
        x_size, w_size, grad_size):
    g = torch.Generator().manual_seed(0)
    # 90 tokens: the weight gradient's summed dimension is padded to 96
    x = (torch.randn(2, 45, 64, generator=g) * x_size).requires_grad_()
    w = (torch.randn(96, 64, generator=g) * w_size).requires_grad_()
    grad = torch.randn(2, 45, 96, generator=g) * grad_size
    (w8,), = fp8_weights([[(w,)]])
    y = fp8_linear(x, w8)
    y.backward(grad)
    x64, w64 = (t.detach().double().requires_grad_() for t in (x, w))
    want = x64 @ w64.T
    want.backward(grad.double())
    assert y.dtype == x.dtype and y.shape == want.shape
    for got, ref, tolerance in ((y, want, FORWARD), (x.grad, x64.grad, GRADIENT),
                                (w.grad, w64.grad, GRADIENT)):
        assert 0.01 < relative_error(got, ref) < tolerance  # fp8's rounding, no more


def test_weights_stacked_at_one_scale_are_float64s_within_fp8s_rounding():
    """Stacked parts of magnitudes far apart (k and v, gate and up) share the group's one
    scale: the matmul and each part's gradient against float64."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 45, 64, generator=g).requires_grad_()
    parts = [(torch.randn(32, 64, generator=g) * s).requires_grad_() for s in (0.02, 30.0)]
    grad = torch.randn(2, 45, 64, generator=g)
    (w8,), = fp8_weights([[tuple(parts)]])
    y = fp8_linear(x, w8)
    y.backward(grad)
    x64, *parts64 = (t.detach().double().requires_grad_() for t in (x, *parts))
    want = x64 @ torch.cat(parts64).T
    want.backward(grad.double())
    assert relative_error(y, want) < FORWARD and relative_error(x.grad, x64.grad) < GRADIENT
    for p, p64 in zip(parts, parts64):
        assert p.grad.dtype == torch.float32 and relative_error(p.grad, p64.grad) < GRADIENT


def float64_twin(mlp: MLP) -> MLP:
    twin = MLP(PRESETS["tiny"]).double()
    twin.load_state_dict(mlp.state_dict())
    return twin


def test_the_mlp_in_fp8_is_the_mlp_within_fp8s_rounding_over_an_unroll():
    torch.manual_seed(0)
    mlp = MLP(PRESETS["tiny"], fp8=True)
    twin = float64_twin(mlp)
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(1, 50, 64, generator=g).requires_grad_() for _ in range(3)]
    grads = [torch.randn(1, 50, 64, generator=g) for _ in xs]
    # three TTT steps on the weights made once, as an unroll reads them
    (weights,) = fp8_weights([mlp.fp8_groups()])
    outs = [mlp(x, weights) for x in xs]
    torch.autograd.backward(outs, grads)
    twin_weights = twin.unroll_weights()
    xs64 = [x.detach().double().requires_grad_() for x in xs]
    wants = [twin(x, twin_weights) for x in xs64]
    torch.autograd.backward(wants, [g.double() for g in grads])
    # Two fp8 matmuls in a row (and the gradients through three) compound their errors:
    # ~6.5 % forward, ~9 % for the gradients, measured.
    for out, want in zip(outs, wants):
        assert 0.01 < relative_error(out, want) < 2 * FORWARD
    for x, x64 in zip(xs, xs64):
        assert relative_error(x.grad, x64.grad) < 2 * GRADIENT
    # each weight's gradient reaches its parameter, gathered over the three steps
    for (name, p), p64 in zip(mlp.named_parameters(), twin.parameters()):
        assert p.grad is not None and p.grad.dtype == torch.float32, name
        assert relative_error(p.grad, p64.grad) < 2 * GRADIENT, name


def recorded_casts(monkeypatch) -> list[list[tuple[int, int]]]:
    """Each call of fp8.weights_to_fp8 from here on: the shapes of the weights it stacked."""
    casts = []
    cast = fp8.weights_to_fp8

    def recorded(groups):
        casts.append([(sum(w.shape[0] for w in group), group[0].shape[1]) for group in groups])
        return cast(groups)
    monkeypatch.setattr(fp8, "weights_to_fp8", recorded)
    return casts


def test_the_weights_are_cast_to_fp8_once_per_unroll(monkeypatch, make_sample):
    casts = recorded_casts(monkeypatch)
    torch.manual_seed(0)
    drafter = Eagle3Drafter(PRESETS["tiny"], fp8=True)
    batch = collate([[make_sample(40, seed=0)]], 40)
    batch.aux_hidden, batch.final_hidden = batch.aux_hidden.float(), batch.final_hidden.float()
    out = drafter(batch, ttt_steps=3)
    out.loss.backward()
    # one call: q, k and v stacked [64 + 2 x 32 outputs x 2 x 64 inputs], o, gate and up
    # stacked, down
    assert casts == [[(128, 128), (64, 64), (2 * 192, 64), (64, 192)]]
    assert all(p.grad is not None for p in drafter.midlayer.parameters())


@pytest.fixture
def cublas_checked(monkeypatch) -> list:
    """torch._scaled_mm refusing what cuBLAS's fp8 matmuls refuse, which the CPU's take: A
    not row-major, B not column-major, a summed or an output dimension that is not a
    multiple of 16, two e5m2 operands. The list of the operands' dtypes it was called with."""
    seen = []
    scaled_mm = torch._scaled_mm

    def checked(a, b, **kwargs):
        assert a.stride(1) == 1 and a.stride(0) == a.shape[1]  # row-major
        assert b.stride(0) == 1 and b.stride(1) == b.shape[0]  # column-major
        assert a.shape[1] % 16 == 0 and b.shape[1] % 16 == 0
        assert fp8.E4M3 in (a.dtype, b.dtype)
        assert kwargs["scale_a"].dtype == kwargs["scale_b"].dtype == torch.float32
        seen.append((a.dtype, b.dtype))
        return scaled_mm(a, b, **kwargs)
    monkeypatch.setattr(torch, "_scaled_mm", checked)
    return seen


@pytest.mark.parametrize("tokens", [48, 77])
def test_every_matmul_takes_the_operands_as_cublas_wants_them(tokens, cublas_checked):
    mlp = MLP(PRESETS["tiny"], fp8=True)
    x = torch.randn(1, tokens, 64, requires_grad=True)
    (weights,) = fp8_weights([mlp.fp8_groups()])
    mlp(x, weights).sum().backward()
    # each of the two projections: forward, then the input's and the weight's gradients
    assert cublas_checked == [(fp8.E4M3, fp8.E4M3)] * 2 + [(fp8.E5M2, fp8.E4M3)] * 4


def fp8_twin(model: torch.nn.Module, make) -> torch.nn.Module:
    """make(fp8=True) holding model's weights and buffers, in float32."""
    twin = make(fp8=True).double()
    twin.load_state_dict(model.state_dict())
    for name, buffer in model.named_buffers():  # the verifier's, not in the state dict
        setattr(twin, name, buffer)
    return twin.float()


def assert_within_fp8s_rounding(loss, want, model, model64):
    """The loss (near uniform logits at the tiny drafters' initial weights: it barely moves)
    and every trained weight's gradient, off by fp8's rounding compounded through the
    layers: 0.4-11 % measured, no more."""
    assert relative_error(loss, want) < FORWARD
    for (name, p), p64 in zip(model.named_parameters(), model64.parameters()):
        if p64.requires_grad:
            assert relative_error(p.grad, p64.grad) < 2 * GRADIENT, name


@pytest.mark.parametrize("frozen_head", [False, True])
def test_eagle3_in_fp8_is_its_float64_twin_within_fp8s_rounding(drafter, make_sample,
                                                                cublas_checked, frozen_head):
    """Every projection of the layer in fp8, over a TTT unroll (and a frozen head's
    gradient): the losses and every weight's gradient, each matmul's operands as cuBLAS
    takes them."""
    in_fp8 = fp8_twin(drafter, lambda fp8: Eagle3Drafter(drafter.cfg, fp8))
    if frozen_head:
        drafter.freeze_lm_head()
        in_fp8.freeze_lm_head()
    batch = collate([[make_sample(77, seed=2)]], 77)
    want = drafter(batch, ttt_steps=3)
    want.loss.backward()
    batch.aux_hidden, batch.final_hidden = batch.aux_hidden.float(), batch.final_hidden.float()
    out = in_fp8(batch, ttt_steps=3)
    out.loss.backward()
    # 3 steps x (q, k and v; o; gate and up; down), each forward and two gradients, and
    # a frozen head's gradient, each step's one chunk
    assert len(cublas_checked) == 3 * 4 * 3 + 3 * frozen_head
    assert_within_fp8s_rounding(out.loss, want.loss.detach(), in_fp8, drafter)


def test_eagle3_in_fp8_recomputed_in_backward_takes_the_same_gradients(make_sample):
    """--checkpoint-ttt with --fp8: the recomputed steps cast and multiply as their first
    forward did, so every gradient is the one without recomputation, bit for bit."""
    batch = collate([[make_sample(77, seed=2)]], 77)
    batch.aux_hidden, batch.final_hidden = batch.aux_hidden.float(), batch.final_hidden.float()
    grads = []
    for checkpoint in (0, 2):
        torch.manual_seed(0)
        drafter = Eagle3Drafter(PRESETS["tiny"], fp8=True)
        drafter(batch, ttt_steps=3, checkpoint=checkpoint).loss.backward()
        grads.append([p.grad for p in drafter.parameters() if p.requires_grad])
    assert all(torch.equal(a, b) for a, b in zip(*grads))


@pytest.mark.gpu
@pytest.mark.parametrize("frozen_head", [False, True])
def test_eagle3_in_fp8_on_cuda_under_autocast_is_its_float64_twin(drafter, make_sample,
                                                                  frozen_head):
    """cuBLAS's fp8 matmuls, the compiled casts and rotary embedding of q and k as views of
    the stacked projection, flex_attention reading v, as a step runs them (bf16 autocast,
    the Triton loss, a frozen head's gradient), a row of tokens that is not a multiple of
    16."""
    in_fp8 = fp8_twin(drafter, lambda fp8: Eagle3Drafter(drafter.cfg, fp8)).cuda()
    if frozen_head:
        drafter.freeze_lm_head()
        in_fp8.freeze_lm_head()
    batch = collate([[make_sample(999, seed=2)]], 999)
    want = drafter(batch, ttt_steps=3)
    want.loss.backward()
    batch.aux_hidden, batch.final_hidden = batch.aux_hidden.float(), batch.final_hidden.float()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = in_fp8(batch.to("cuda"), ttt_steps=3)
    out.loss.backward()
    assert_within_fp8s_rounding(out.loss.cpu(), want.loss.detach(), in_fp8.cpu(), drafter)


@pytest.mark.gpu
def test_dflash_in_fp8_on_cuda_under_autocast_is_its_float64_twin(monkeypatch):
    """Each layer's projections as fp8 matmuls on cuBLAS, under bf16 autocast as DFlash's
    step runs them, against the float64 drafter on the CPU: both draw their anchors on the
    CPU, from one seed."""
    from training.drafters.dflash import model as dflash_model
    drafter, batch = tiny_drafter_and_rows()
    in_fp8 = fp8_twin(drafter, lambda fp8: DFlashDrafter(drafter.cfg, fp8)).cuda()
    draw = dflash_model.sample_anchors

    def drawn_on_the_cpu(loss_mask, doc_ids, *args):
        torch.manual_seed(5)
        return tuple(t.to(doc_ids.device) for t in draw(loss_mask.cpu(), doc_ids.cpu(), *args))
    monkeypatch.setattr(dflash_model, "sample_anchors", drawn_on_the_cpu)
    want = drafter(batch, batch.aux_hidden, 12, gamma=2.0)
    want.total.backward()
    batch.aux_hidden, batch.final_hidden = batch.aux_hidden.float(), batch.final_hidden.float()
    batch = batch.to("cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = in_fp8(batch, batch.aux_hidden, 12, gamma=2.0)
    out.total.backward()
    assert_within_fp8s_rounding(out.total.cpu(), want.total.detach(), in_fp8.cpu(), drafter)


def test_dflash_in_fp8_is_its_float64_twin_within_fp8s_rounding(cublas_checked):
    drafter, batch = tiny_drafter_and_rows()
    cfg = drafter.cfg
    in_fp8 = fp8_twin(drafter, lambda fp8: DFlashDrafter(cfg, fp8))
    torch.manual_seed(5)
    want = drafter(batch, batch.aux_hidden, 12, gamma=2.0)
    want.total.backward()
    torch.manual_seed(5)  # the same anchors
    out = in_fp8(batch, batch.aux_hidden.float(), 12, gamma=2.0)
    out.total.backward()
    # each layer's q, k and v, o, gate and up, down: each forward and two gradients; the
    # loss's one chunk: the gradient through the verifier's head
    assert len(cublas_checked) == cfg.num_layers * 5 * 3 + 1
    # after the layers' forward matmuls, before backward: the loss's
    assert cublas_checked[cfg.num_layers * 5] == (fp8.E5M2, fp8.E4M3)
    assert_within_fp8s_rounding(out.total, want.total.detach(), in_fp8, drafter)


def test_a_frozen_head_is_cast_once_and_again_when_it_changes():
    def same(made, weight) -> bool:
        return all(torch.equal(a.float(), b.float())
                   for a, b in zip(made, fp8.frozen_to_fp8(weight)))
    head = torch.nn.Parameter(torch.randn(96, 64), requires_grad=False)
    cast = fp8.FrozenFp8()
    first = cast(head)
    assert cast(head) is first and same(first, head)  # the next step's: not cast again
    with torch.no_grad():
        head.mul_(10)  # as a checkpoint's load copies into it
    assert same(cast(head), head) and not same(first, head)
    head.data = head.data.double()  # as Module.to() swaps a parameter's data
    assert cast(head)[0].shape == (64, 96) and same(cast(head), head)
    other = torch.randn(96, 64)  # a new head (load_verifier)
    assert same(cast(other), other)
    # a vocabulary cuBLAS cannot sum over in fp8: the gradient stays in bf16
    assert cast(torch.randn(100, 64)) is None


@pytest.mark.slow
def test_the_casts_compiled_are_the_eager_casts_one_graph_for_every_row_length():
    """As cuda_compiled compiles them for CUDA, here for the CPU (inductor's C++): the
    same fp8 bytes, the padding at rows that are not whole multiples of 16, no recompile."""
    g = torch.Generator().manual_seed(0)
    islands = [(fp8.to_fp8, lambda L: (torch.randn(L, 64, generator=g), fp8.E5M2)),
               (fp8.rows_to_fp8, lambda L: (torch.randn(L, 96, generator=g), fp8.E5M2)),
               (layers.swiglu_to_fp8, lambda L: (torch.randn(L, 384, generator=g),)),
               (layers.swiglu_to_fp8_t, lambda L: (torch.randn(L, 384, generator=g),))]
    for island, inputs in islands:
        compiled = compile_island(island.__wrapped__, island.varying)
        graphs = []
        for L in (48, 77):
            args = inputs(L)
            for got, want in zip(compiled(*args), island.__wrapped__(*args)):
                assert got.shape == want.shape and got.stride() == want.stride()
                assert torch.equal(got.float(), want.float())
            graphs.append(counters["stats"]["unique_graphs"])
        assert graphs[1] == graphs[0], island.__name__
    groups = [(torch.randn(96, 64, generator=g), torch.randn(32, 64, generator=g) * 9),
              (torch.randn(64, 96, generator=g),)]
    compiled = compile_island(fp8.weights_to_fp8.__wrapped__, dynamic=False)
    head = groups[0][0]
    frozen = compile_island(fp8.frozen_to_fp8.__wrapped__, fp8.frozen_to_fp8.varying, False)
    for made, eager in [*zip(compiled(groups), fp8.weights_to_fp8.__wrapped__(groups)),
                        (frozen(head), fp8.frozen_to_fp8.__wrapped__(head))]:
        for got, want in zip(made, eager):
            assert got.stride() == want.stride() and torch.equal(got.float(), want.float())
    stacked = layers.swiglu_backward_stacked
    compiled = compile_island(stacked.__wrapped__, stacked.varying)
    gate_up, grad = torch.randn(77, 384, generator=g), torch.randn(77, 192, generator=g)
    torch.testing.assert_close(compiled(gate_up, grad), stacked.__wrapped__(gate_up, grad))


@pytest.mark.gpu
def test_the_mlp_in_fp8_on_cuda_under_autocast_is_the_mlp_within_fp8s_rounding():
    """cuBLAS's fp8 matmuls (their layouts and alignment) and the compiled casts, as a
    step runs them: bf16 autocast, a row of tokens that is not a multiple of 16."""
    torch.manual_seed(0)
    mlp = MLP(PRESETS["tiny"], fp8=True)
    twin = float64_twin(mlp).cuda()
    mlp.cuda()
    x = torch.randn(2, 999, 64, device="cuda")
    grad = torch.randn(2, 999, 64, device="cuda")
    xb = x.to(torch.bfloat16).requires_grad_()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        (weights,) = fp8_weights([mlp.fp8_groups()])
        out = mlp(xb, weights)
    out.backward(grad.to(torch.bfloat16))
    x64 = xb.detach().double().requires_grad_()
    want = twin(x64, twin.unroll_weights())
    want.backward(grad.double())
    assert out.dtype == torch.bfloat16 and xb.grad.dtype == torch.bfloat16
    assert 0.01 < relative_error(out, want) < 2 * FORWARD
    assert relative_error(xb.grad, x64.grad) < 2 * GRADIENT
    for (name, p), p64 in zip(mlp.named_parameters(), twin.parameters()):
        assert relative_error(p.grad, p64.grad) < 2 * GRADIENT, name


def test_fp8_is_refused_below_ada_and_for_sizes_cublas_cannot_take():
    tiny = PRESETS["tiny"]
    assert fp8.refusal(None, tiny) is None  # the CPU: the tests
    for card in ((8, 9), (9, 0), (10, 0), (12, 0)):  # L40S, H100/H200, B200, RTX 50xx
        assert fp8.refusal(card, tiny) is None, card
        assert fp8.refusal(card, DFLASH_PRESETS["qwen3-8b"]) is None, card
    for card in ((7, 0), (8, 0), (8, 6), (8, 7)):  # V100, A100, A10/RTX 30xx, Orin
        assert "8.9" in fp8.refusal(card, tiny), card
    odd = PRESETS["tiny"].__class__(**{**tiny.to_dict(), "intermediate_size": 200})
    assert "intermediate_size 200" in fp8.refusal(None, odd)
    odd = PRESETS["tiny"].__class__(**{**tiny.to_dict(), "head_dim": 20})  # q 4 x 20, k 2 x 20
    assert fp8.refusal(None, odd) == ("fp8 matmuls need sizes that are multiples of 16: "
                                      "num_kv_heads × head_dim 40")


def test_train_refuses_fp8_for_a_shape_it_cannot_run_naming_the_flag(tmp_path, cache,
                                                                     capsys):
    shape = {**PRESETS["tiny"].to_dict(), "intermediate_size": 200}
    (tmp_path / "odd.json").write_text(json.dumps(shape))
    code = main(["train", "--synthetic", "--fp8", "--model-config", str(tmp_path / "odd.json"),
                 "--steps", "1", "--max-seq-len", "128", "--out", str(tmp_path / "run")])
    assert code == 2
    err = capsys.readouterr().err
    assert "--fp8" in err and "intermediate_size 200" in err
    assert not (tmp_path / "run").exists()


def run_in_fp8(run_dir, monkeypatch, *args) -> tuple[list[dict], list]:
    """A `train --synthetic --fp8` run's events, and its calls that cast weights to fp8."""
    casts = recorded_casts(monkeypatch)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls gain nothing from more threads
    try:
        assert main(["train", "--synthetic", "--fp8", *args, "--save-every", "0",
                     "--device", "cpu", "--out", str(run_dir)]) == 0
    finally:
        torch.set_num_threads(threads)
    events = [json.loads(line)
              for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert events[0]["event"] == "start" and events[0]["config"]["fp8"] is True
    return events, casts


def test_a_synthetic_eagle3_run_in_fp8_learns_and_says_so(tmp_path, cache, monkeypatch):
    events, casts = run_in_fp8(tmp_path / "run", monkeypatch, "--steps", "12",
                               "--max-seq-len", "128", "--lr", "1e-2")
    losses = [e["loss"] for e in events if e["event"] == "step"]
    assert len(losses) == 12  # each step's unroll: one call for its 4 stacks of weights
    assert len(casts) == 12 and all(len(groups) == 4 for groups in casts)
    assert sum(losses[-4:]) < 0.95 * sum(losses[:4]), losses


def test_a_synthetic_dflash_run_in_fp8_runs_each_layers_mlp_in_fp8(tmp_path, cache,
                                                                   monkeypatch):
    events, casts = run_in_fp8(tmp_path / "run", monkeypatch, "--drafter", "dflash",
                               "--steps", "2", "--max-seq-len", "256", "--max-anchors",
                               "16", "--block-size", "4")
    steps = [e for e in events if e["event"] == "step"]
    assert len(steps) == 2 and all(e["loss"] > 0 for e in steps)
    layers = DFLASH_PRESETS["tiny"].num_layers
    # one call per layer and step, of its q, k-and-v, o, gate-and-up, down
    assert len(casts) == 2 * layers and all(len(groups) == 5 for groups in casts)


def test_an_fp8_runs_peak_is_not_read_as_the_memory_models(tmp_path, cache, monkeypatch):
    events, _ = run_in_fp8(tmp_path / "run", monkeypatch, "--steps", "1", "--max-seq-len",
                           "128")
    start = {**events[0], "config": {**events[0]["config"], "device": "cuda"}}
    with pytest.raises(ValueError, match="fp8"):
        shape_from_start(start)
    shape_from_start({**start, "config": {**start["config"], "fp8": False}})  # as bf16: read
