import pytest
import torch

from training.drafters.eagle3.loss import soft_cross_entropy as soft_cross_entropy_of_targets
from training.drafters.eagle3.loss import verifier_targets
from training.drafters.eagle3.vocab import build_draft_vocab, default_draft_vocab_size


def soft_cross_entropy(hidden, weight, target_hidden, target_weight, chunk=2048):
    """Each position scored against the verifier's distribution at the same position:
    (sum, per-position losses, agree)."""
    targets = verifier_targets(target_hidden, target_weight, chunk)
    return soft_cross_entropy_of_targets(hidden, weight, targets,
                                         torch.arange(hidden.shape[0]), chunk)


def reference(hidden, weight, target_hidden, target_weight):
    target = torch.softmax(target_hidden @ target_weight.T, dim=-1)
    return -(target * torch.log_softmax(hidden @ weight.T, dim=-1)).sum(-1)


def inputs(P, V=300, H=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(P, H, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(V, H, generator=g, dtype=torch.float64, requires_grad=True)
    return (hidden, weight, torch.randn(P, H, generator=g, dtype=torch.float64),
            torch.randn(V, H, generator=g, dtype=torch.float64))


@pytest.mark.parametrize("chunk", [1, 7, 64, 1000])
def test_chunked_equals_unchunked_loss_and_gradient(chunk):
    hidden, weight, target_hidden, target_weight = inputs(100)
    total, losses, agree = soft_cross_entropy(hidden, weight, target_hidden, target_weight,
                                              chunk)
    assert not losses.requires_grad
    # The gradients are taken in forward for an upstream 1; backward scales them.
    grads = torch.autograd.grad(0.37 * total, (hidden, weight))
    expected = reference(hidden, weight, target_hidden, target_weight)
    expected_grads = torch.autograd.grad(0.37 * expected.sum(), (hidden, weight))
    # float64 throughout: only summation order differs.
    torch.testing.assert_close(losses, expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(total, expected.sum(), rtol=1e-10, atol=1e-12)
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    want_agree = (hidden @ weight.T).argmax(-1) == (target_hidden @ target_weight.T).argmax(-1)
    assert torch.equal(agree, want_agree)


def test_no_positions_give_a_zero_loss_and_zero_head_gradient():
    # a TTT step whose positions all fall past their samples' ends scores none
    _, weight, _, target_weight = inputs(0)
    targets = verifier_targets(torch.randn(5, 24, dtype=torch.float64), target_weight)
    hidden = torch.zeros(0, 24, dtype=torch.float64, requires_grad=True)
    total, losses, _ = soft_cross_entropy_of_targets(hidden, weight, targets,
                                                     torch.zeros(0, dtype=torch.long))
    assert total.item() == 0 and losses.shape == (0,)
    assert torch.equal(torch.autograd.grad(total, weight)[0], torch.zeros_like(weight))


def test_gradients_only_for_the_inputs_that_take_them():
    hidden, weight, target_hidden, target_weight = inputs(40)
    frozen_head = weight.detach()
    total, _, _ = soft_cross_entropy(hidden, frozen_head, target_hidden, target_weight, 16)
    (grad,) = torch.autograd.grad(total, (hidden,))
    want = torch.autograd.grad(reference(hidden, frozen_head, target_hidden,
                                         target_weight).sum(), (hidden,))[0]
    torch.testing.assert_close(grad, want, rtol=1e-10, atol=1e-12)
    with torch.no_grad():
        total, losses, _ = soft_cross_entropy(hidden, weight, target_hidden, target_weight, 16)
    assert not total.requires_grad
    torch.testing.assert_close(losses, reference(hidden, weight, target_hidden,
                                                 target_weight).detach())


def test_loss_is_forward_kl_plus_target_entropy():
    hidden, weight, target_hidden, target_weight = inputs(20)
    _, losses, _ = soft_cross_entropy(hidden, weight, target_hidden, target_weight, 8)
    log_q = torch.log_softmax(target_hidden @ target_weight.T, -1)
    log_p = torch.log_softmax(hidden @ weight.T, -1)
    kl = (log_q.exp() * (log_q - log_p)).sum(-1)
    entropy = -(log_q.exp() * log_q).sum(-1)
    torch.testing.assert_close(losses, kl + entropy, rtol=1e-10, atol=1e-12)


def test_peak_memory_is_bounded_by_the_chunk_not_the_positions(peak_allocated_bytes):
    # The verifier's table [P, V] is made once per batch, outside this measure; what the
    # loss itself allocates must not grow with P.
    V, chunk = 4096, 64

    def peak(P, chunked):
        hidden, weight, target_hidden, target_weight = (
            t.float().detach().requires_grad_(t.requires_grad)
            for t in inputs(P, V=V, H=16))
        targets = verifier_targets(target_hidden, target_weight, chunk)

        def step():
            if chunked:
                total, _, _ = soft_cross_entropy_of_targets(hidden, weight, targets,
                                                            torch.arange(P), chunk)
            else:
                total = reference(hidden, weight, target_hidden, target_weight).sum()
            total.backward()
        return peak_allocated_bytes(step)

    P = 1024
    chunked_small, chunked_big = peak(P, True), peak(4 * P, True)
    plain_small, plain_big = peak(P, False), peak(4 * P, False)
    one_logits_matrix = P * V * 4
    # Unchunked holds several [P, V] float32 matrices, so it grows with P...
    assert plain_big - plain_small > 3 * one_logits_matrix
    # ...while chunked stays at a few [chunk, V] matrices plus O(P) vectors.
    assert chunked_big < 6 * chunk * V * 4
    assert chunked_big - chunked_small < 0.05 * one_logits_matrix


def test_bfloat16_activations_give_float32_losses_close_to_float64():
    hidden, weight, target_hidden, target_weight = (t.detach() * 0.25 for t in inputs(50))
    h = hidden.bfloat16().requires_grad_()
    w = weight.float().requires_grad_()
    total, losses, _ = soft_cross_entropy(h, w, target_hidden.bfloat16(), target_weight, 16)
    assert losses.dtype == torch.float32
    expected = reference(hidden, weight, target_hidden, target_weight)
    torch.testing.assert_close(losses.double(), expected, rtol=0.05, atol=0.05)
    grads = torch.autograd.grad(total, (h, w))
    assert grads[0].dtype == torch.bfloat16 and grads[1].dtype == torch.float32
    want = torch.autograd.grad(reference(*(t.requires_grad_() for t in (hidden, weight)),
                                         target_hidden, target_weight).sum(), (hidden, weight))
    for got, w_ in zip(grads, want):
        assert (got.double() - w_).norm() / w_.norm() < 0.02


def test_target_side_takes_no_gradient():
    hidden, weight, target_hidden, target_weight = inputs(4)
    targets = verifier_targets(target_hidden, target_weight)
    targets.probs.requires_grad_()
    with pytest.raises(ValueError, match="target side"):
        soft_cross_entropy_of_targets(hidden, weight, targets, torch.arange(4))


def test_each_position_is_scored_against_its_target_row():
    # A TTT step scores position i against the verifier at i + k + 1: any row mapping.
    hidden, weight, target_hidden, target_weight = inputs(30)
    rows = torch.randint(30, (30,), generator=torch.Generator().manual_seed(1))
    targets = verifier_targets(target_hidden, target_weight, chunk=7)
    _, losses, agree = soft_cross_entropy_of_targets(hidden, weight, targets, rows, chunk=4)
    expected = reference(hidden, weight, target_hidden[rows], target_weight)
    torch.testing.assert_close(losses, expected, rtol=1e-10, atol=1e-12)
    want_agree = (hidden @ weight.T).argmax(-1) == (target_hidden[rows] @ target_weight.T).argmax(-1)
    assert torch.equal(agree, want_agree)


@pytest.mark.gpu
def test_bf16_on_cuda_gives_the_float64_gradients():
    """The CUDA path: bf16 matmuls, the head gradient summed in float32 inside them."""
    hidden, weight, target_hidden, target_weight = (t.detach() * 0.25 for t in
                                                    inputs(3000, V=2000, H=64))
    hidden.requires_grad_(), weight.requires_grad_()
    targets = verifier_targets(target_hidden.cuda().bfloat16(), target_weight.cuda(), 512)
    h = hidden.detach().cuda().bfloat16().requires_grad_()
    w = weight.detach().float().cuda().requires_grad_()
    total, losses, _ = soft_cross_entropy_of_targets(h, w, targets, torch.arange(3000).cuda(),
                                                     512)
    grads = torch.autograd.grad(0.5 * total, (h, w))
    assert grads[1].dtype == torch.float32
    expected = reference(hidden, weight, target_hidden, target_weight)
    want = torch.autograd.grad(0.5 * expected.sum(), (hidden, weight))
    torch.testing.assert_close(losses.cpu().double(), expected.detach(), rtol=0.02, atol=0.05)
    for got, w_ in zip(grads, want):
        err = (got.cpu().double() - w_).norm() / w_.norm()
        assert err < 0.02, err


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("V", [100, 4096, 5003])
def test_triton_chunk_pass_matches_the_torch_one_on_cuda(dtype, V):
    """loss_triton's kernel against loss._chunk_losses run eagerly: losses, the first
    index of a tied maximum, the gradient, and the pass without one."""
    from training.drafters.eagle3 import loss, loss_triton
    g = torch.Generator(device="cuda").manual_seed(V)
    logits = (torch.randn(37, V, generator=g, device="cuda") * 4).to(dtype)
    logits[0, [3, V // 2, V - 1]] = 30.0  # a three-way tie
    logits[1, V - 1] = 30.0  # the maximum in the last, partial block
    probs = torch.randn(50, V, generator=g, device="cuda").softmax(-1).to(dtype)
    rows = torch.randint(0, 50, (37,), generator=g, device="cuda")
    want = loss._chunk_losses(logits, probs, rows, want_grad=True)
    got = loss_triton.chunk_losses(logits, probs, rows, want_grad=True)
    assert got[0].dtype == torch.float32 and got[2].dtype == dtype
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-4)
    assert torch.equal(got[1], want[1]) and got[1][0] == 3 and got[1][1] == V - 1
    # float32: exp's last bits differ; bf16: one step below 1
    tol = dict(rtol=0, atol=2**-8) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got[2].float(), want[2].float(), **tol)
    losses, argmax, grad = loss_triton.chunk_losses(logits, probs, rows, want_grad=False)
    assert grad is None and torch.equal(losses, got[0]) and torch.equal(argmax, got[1])
    empty = loss_triton.chunk_losses(logits[:0], probs, rows[:0], want_grad=True)
    assert empty[0].shape == (0,) and empty[2].shape == (0, V)


def test_draft_vocab_is_the_most_frequent_tokens_ties_to_the_lower_id():
    counts = torch.tensor([5, 0, 9, 5, 1, 5, 9])
    d2t, t2d = build_draft_vocab(counts, 4)
    # 9, 9 (ids 2, 6), then three 5s of which ids 0 and 3 win the tie.
    assert d2t.tolist() == [0, 2, 3, 6]
    assert t2d.tolist() == [True, False, True, True, False, False, True]
    assert build_draft_vocab(counts, 7)[0].tolist() == list(range(7))
    with pytest.raises(ValueError, match="draft_vocab_size"):
        build_draft_vocab(counts, 8)
    assert default_draft_vocab_size(128256) == 32000
    assert default_draft_vocab_size(512) == 512
