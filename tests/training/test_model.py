import math

import pytest
import torch

from training.drafters.eagle3.attention import DocLayout, doc_causal_block_mask, ttt_attention
from training.packing import collate

TTT = 4
DECAY = 0.8


def sample_positions(steps, batch, row, doc):
    """Each step's per-position losses of one sample of a batch, in column order."""
    out = []
    for step in steps:
        rows, cols = step.index.unbind(1)
        keep = (rows == row) & (batch.doc_ids[rows, cols] == doc)
        out.append(step.losses[keep])
    return out


def weighted(steps):
    return sum(DECAY ** k * step.total for k, step in enumerate(steps))


def trainable_grads(model, objective):
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.autograd.grad(objective, params, retain_graph=True)


def test_packed_rows_equal_samples_alone(drafter, make_sample):
    lengths = (17, 30, 25, 40)
    samples = [make_sample(n, seed=i) for i, n in enumerate(lengths)]
    # Row 0: three samples and 24 tokens of padding; row 1: one sample and padding.
    packed = collate([samples[:3], samples[3:]], 96)
    steps = drafter.step_losses(packed, TTT, loss_chunk=16)
    where = [(0, 0), (0, 1), (0, 2), (1, 0)]
    total, counts = [0.0] * TTT, [0] * TTT
    want = None
    for sample, (row, doc) in zip(samples, where):
        alone = drafter.step_losses(collate([[sample]], len(sample["input_ids"])), TTT,
                                    loss_chunk=16)
        in_pack = sample_positions(steps, packed, row, doc)
        for k in range(TTT):
            # float64: equal up to summation order.
            torch.testing.assert_close(in_pack[k], alone[k].losses, rtol=1e-10, atol=1e-12)
            total[k] += alone[k].losses.sum().item()
            counts[k] += alone[k].losses.numel()
        grads = trainable_grads(drafter, weighted(alone))
        want = grads if want is None else [w + g for w, g in zip(want, grads)]
    # A sample that saw a neighbour would move the packed gradient off the sum of theirs.
    for g, w in zip(trainable_grads(drafter, weighted(steps)), want):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-12)

    out = drafter(packed, TTT, DECAY, loss_chunk=16)
    assert out.positions == counts
    expected = sum(DECAY ** k * total[k] / counts[k] for k in range(TTT))
    assert out.loss.item() == pytest.approx(expected, rel=1e-10)
    # Step k of a sample of n tokens can score at most n - k - 1 positions.
    assert all(counts[k] <= sum(n - k - 1 for n in lengths) for k in range(TTT))
    assert all(0 <= a <= 1 for a in out.acc_ttt)


@pytest.mark.parametrize("checkpoint", [1, 2, TTT])
def test_checkpointed_ttt_steps_give_the_same_losses_and_gradients(drafter, make_sample,
                                                                    checkpoint):
    batch = collate([[make_sample(n, seed=i) for i, n in enumerate((30, 41))]], 80)
    plain = drafter.step_losses(batch, TTT, loss_chunk=16)
    kept = drafter.step_losses(batch, TTT, loss_chunk=16, checkpoint=checkpoint)
    for a, b in zip(plain, kept):
        torch.testing.assert_close(a.losses, b.losses, rtol=0, atol=0)
        assert torch.equal(a.index, b.index)
    want = trainable_grads(drafter, weighted(plain))
    got = trainable_grads(drafter, weighted(kept))
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


def test_checkpointing_keeps_less_for_backward(drafter, make_sample):
    from torch.autograd.graph import saved_tensors_hooks
    batch = collate([[make_sample(60, seed=0)]], 64)

    def saved_bytes(checkpoint):
        total = 0

        def pack(t):
            nonlocal total
            total += t.numel() * t.element_size()
            return t
        with saved_tensors_hooks(pack, lambda t: t):
            drafter.step_losses(batch, TTT, loss_chunk=16, checkpoint=checkpoint)
        return total
    every, two, none = saved_bytes(TTT), saved_bytes(2), saved_bytes(0)
    assert every < 0.5 * none
    # two of the four steps recomputed: about half of what the steps keep
    assert every + 0.4 * (none - every) < two < every + 0.6 * (none - every)
    with pytest.raises(ValueError, match="counts TTT steps"):
        drafter.step_losses(batch, TTT, checkpoint=True)


def test_a_sample_never_sees_its_neighbours(drafter, make_sample):
    samples = [make_sample(n, seed=i) for i, n in enumerate((20, 33, 27))]
    before = drafter.step_losses(collate([samples], 96), TTT)
    # Same loss mask (so the same positions count), everything else new.
    samples[1] = dict(make_sample(33, seed=99), loss_mask=samples[1]["loss_mask"])
    after = drafter.step_losses(collate([samples], 96), TTT)
    batch = collate([samples], 96)
    for k in range(TTT):
        assert torch.equal(before[k].index, after[k].index)
        for doc, same in ((0, True), (1, False), (2, True)):
            b = sample_positions(before, batch, 0, doc)[k]
            a = sample_positions(after, batch, 0, doc)[k]
            assert torch.equal(a, b) == same, (k, doc)


def test_step_k_at_index_i_sees_exactly_the_tokens_up_to_i_plus_k_plus_1(drafter, make_sample):
    # Chain i at step k stands for position i + k: changing token c may only reach
    # indices i >= c - k - 1, and does reach i = c - k - 1 (the token it reads).
    sample = make_sample(40, seed=3)
    sample["loss_mask"][:] = True
    c = 30
    before = drafter.step_losses(collate([[sample]], 40), TTT)
    sample["input_ids"][c] = (sample["input_ids"][c] + 1) % drafter.cfg.vocab_size
    after = drafter.step_losses(collate([[sample]], 40), TTT)
    for k in range(TTT):
        assert before[k].index[:, 1].tolist() == list(range(40 - k - 1))
        first = c - k - 1
        assert torch.equal(before[k].losses[:first], after[k].losses[:first])
        assert before[k].losses[first] != after[k].losses[first]


def random_docs(B, L, seed):
    g = torch.Generator().manual_seed(seed)
    docs = torch.full((B, L), -1)
    for b in range(B):
        at, d = 0, 0
        while True:
            n = int(torch.randint(1, L // 2, (1,), generator=g))
            if at + n > L - int(torch.randint(0, 40, (1,), generator=g)):
                break
            docs[b, at:at + n] = d
            at, d = at + n, d + 1
    return docs


def reference_mask(doc_ids, segments):
    """[B, L, segments * L]: document-causal over the first segment, the diagonal after."""
    B, L = doc_ids.shape
    i = torch.arange(L, device=doc_ids.device)
    pad = torch.where(doc_ids < 0, L + 1, doc_ids)
    step0 = (pad[:, :, None] == pad[:, None, :]) & (i[None, None, :] <= i[None, :, None])
    diag = torch.eye(L, dtype=torch.bool, device=doc_ids.device).expand(B, L, L)
    return torch.cat([step0] + [diag] * (segments - 1), dim=2)


def reference_ttt_attention(q, keys, values, doc_ids):
    """Plain softmax over the (k+1) x L keys of the TTT scheme, with an explicit mask."""
    B, Hq, L, D = q.shape
    G = Hq // keys[0].shape[1]
    k = torch.cat(keys, dim=2).repeat_interleave(G, dim=1)
    v = torch.cat(values, dim=2).repeat_interleave(G, dim=1)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(D)
    scores = scores.masked_fill(~reference_mask(doc_ids, len(keys))[:, None], float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


@pytest.mark.parametrize("steps", [0, 1, 3])
def test_ttt_attention_is_softmax_over_step0_and_diagonal_keys(steps):
    g = torch.Generator().manual_seed(steps)
    B, Hq, Hkv, L, D = 2, 4, 2, 50, 8
    doc_ids = random_docs(B, L, seed=steps)

    def rand(h):
        return torch.randn(B, h, L, D, generator=g, dtype=torch.float64, requires_grad=True)
    q = rand(Hq)
    keys = [rand(Hkv) for _ in range(steps + 1)]
    values = [rand(Hkv) for _ in range(steps + 1)]
    inputs = [q, *keys, *values]
    got = ttt_attention(q, keys, values, DocLayout(doc_ids))
    want = reference_ttt_attention(q, keys, values, doc_ids)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    upstream = torch.randn(got.shape, generator=g, dtype=torch.float64)
    for a, b in zip(torch.autograd.grad((got * upstream).sum(), inputs),
                    torch.autograd.grad((want * upstream).sum(), inputs)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def blocks_of(block_mask, partial: bool):
    """{(row, q block, kv block)} listed by a BlockMask (partial or full blocks)."""
    num = block_mask.kv_num_blocks if partial else block_mask.full_kv_num_blocks
    idx = block_mask.kv_indices if partial else block_mask.full_kv_indices
    return {(b, q, int(idx[b, 0, q, n])) for b in range(num.shape[0])
            for q in range(num.shape[2]) for n in range(int(num[b, 0, q]))}


def test_block_mask_covers_exactly_the_document_causal_pairs():
    B, L, BS = 3, 1024, 128
    doc_ids = random_docs(B, L, seed=5)
    doc_ids[2] = 0  # one sample filling the whole row
    mask = doc_causal_block_mask(doc_ids)
    assert mask.shape[-2:] == (L, L)
    partial, full = blocks_of(mask, True), blocks_of(mask, False)
    assert not partial & full
    nq = nkv = L // BS
    per_block = reference_mask(doc_ids, 1).view(B, nq, BS, nkv, BS)
    any_allowed = per_block.any(dim=(2, 4))
    all_allowed = per_block.all(dim=(2, 4))
    for b in range(B):
        for q in range(nq):
            for kv in range(nkv):
                listed = (b, q, kv) in partial or (b, q, kv) in full
                assert listed == bool(any_allowed[b, q, kv]), (b, q, kv)
                if (b, q, kv) in full:
                    assert all_allowed[b, q, kv]
    assert full  # the long sample has full blocks that skip mask_mod


def test_block_mask_of_a_long_row_is_built_without_an_L_by_L_grid(peak_allocated_bytes):
    L = 65536  # an L x L bool grid would be 4 GiB
    doc_ids = torch.repeat_interleave(torch.arange(16), L // 16)[None]
    peak = peak_allocated_bytes(lambda: doc_causal_block_mask(doc_ids))
    # block-level tensors: (L / 128)^2 entries, a few int64 copies of them while the mask
    # is transposed for backward, against 4 GiB for the grid
    assert peak < 128 * 2**20


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_attention_with_the_block_mask_matches_the_reference_on_cpu():
    # flex_attention runs eagerly (forward only) on CPU: this checks mask_mod.
    from torch.nn.attention.flex_attention import flex_attention
    g = torch.Generator().manual_seed(0)
    B, Hq, Hkv, L, D = 2, 4, 2, 256, 16
    doc_ids = random_docs(B, L, seed=7)
    q = torch.randn(B, Hq, L, D, generator=g)
    k, v = (torch.randn(B, Hkv, L, D, generator=g) for _ in range(2))
    out = flex_attention(q, k, v, block_mask=doc_causal_block_mask(doc_ids), enable_gqa=True)
    want = reference_ttt_attention(q, [k], [v], doc_ids)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)


def run_compiled_flex_at_two_lengths(device: str, backward: bool) -> None:
    """The trainer's compiled flex at row lengths 256 then 384: matches the reference, and
    the 384 calls reuse the 256 calls' graphs (block counts symbolic, so inductor's disk
    cache serves a relaunch at a new length). On CUDA, ttt_attention with one key segment
    and three; inductor's CPU flex has no log-sum-exp output, so on CPU flex alone."""
    from torch._dynamo.utils import counters

    from training.flex import compiled_flex
    g = torch.Generator().manual_seed(1)
    B, Hq, Hkv, D = 1, 4, 2, 16
    graphs = []
    for L in (256, 384):
        doc_ids = random_docs(B, L, seed=L).to(device)
        layout = DocLayout(doc_ids, use_flex=True)
        for S in (1, 2, 4) if backward else (1,):
            def rand(h):
                return torch.randn(B, h, L, D, generator=g).to(device).requires_grad_(backward)
            q, keys, values = rand(Hq), [rand(Hkv) for _ in range(S)], [rand(Hkv) for _ in range(S)]
            if backward:
                out = ttt_attention(q, keys, values, layout)
            else:
                out = compiled_flex()(q, keys[0], values[0], block_mask=layout.mask(1),
                                       enable_gqa=True)
            want = reference_ttt_attention(q, keys, values, doc_ids)
            torch.testing.assert_close(out, want, rtol=5e-3, atol=5e-3)
            if backward:
                out.sum().backward()
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[1] == graphs[0], "a new row length compiled flex again"


@pytest.mark.slow
def test_compiled_flex_serves_a_new_row_length_without_recompiling_on_cpu():
    run_compiled_flex_at_two_lengths("cpu", backward=False)  # no CPU backward for flex


@pytest.mark.gpu
def test_compiled_flex_serves_a_new_row_length_without_recompiling_on_cuda():
    run_compiled_flex_at_two_lengths("cuda", backward=True)


@pytest.mark.gpu
def test_compiled_islands_serve_a_new_row_length_without_recompiling_on_cuda():
    """Norms, RoPE, SwiGLU and the verifier's targets compiled at row length 256 serve 384
    with the same graphs (only the row's dims are symbolic), and agree with their eager
    selves."""
    from torch._dynamo.utils import counters

    from training.drafters.eagle3.loss import _target_chunk
    from training.drafters.eagle3.model import side_by_side_norms
    from training.layers import (norm_rope, rms_norm, rope, rotary_tables, swiglu,
                                 swiglu_backward)
    g = torch.Generator(device="cuda").manual_seed(0)
    H, I, Hq, D, V = 64, 96, 4, 16, 100

    def rand(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, generator=g, device="cuda", dtype=dtype)
    graphs = []
    for L in (256, 384):
        cos, sin = rotary_tables(torch.arange(L, device="cuda")[None], D, 1e4, torch.float32)
        calls = [(rms_norm, (rand(1, L, H).requires_grad_(), rand(H, dtype=torch.float32), 1e-6)),
                 (rms_norm, (rand(L // 3, H), rand(H, dtype=torch.float32), 1e-6)),
                 (side_by_side_norms, (rand(1, L, H), rand(1, L, H).requires_grad_(),
                                       rand(H, dtype=torch.float32),
                                       rand(H, dtype=torch.float32), 1e-6)),
                 (rope, (rand(1, L, Hq, D).requires_grad_(), cos, sin)),
                 (norm_rope, (rand(1, L, Hq, D).requires_grad_(), rand(D, dtype=torch.float32),
                              1e-6, cos, sin)),
                 (swiglu, (rand(1, L, I), rand(1, L, I))),
                 (swiglu_backward, (rand(1, L, I), rand(1, L, I), rand(1, L, I))),
                 (_target_chunk, (rand(L // 4, V),))]
        for island, args in calls:
            got, want = island(*args), island.__wrapped__(*args)
            for a, b in zip(*((t,) if isinstance(t, torch.Tensor) else t for t in (got, want))):
                torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2)
            if isinstance(got, torch.Tensor) and got.requires_grad:
                got.float().sum().backward()
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[1] == graphs[0], "a new row length compiled an island again"


@pytest.mark.gpu
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_fold_matches_the_torch_fold_on_cuda(dtype, padded):
    """fold_triton's kernels against attention's torch fold (run eagerly), forward and
    backward, on the layouts the trainer hands them: q token-major as rope leaves it (a
    transposed view), flex's output in q's layout or, for a row padded to whole blocks,
    sliced from the padded one, and o_proj's gradient with its heads split. The output and
    the gradients of q and of flex's output come back in those layouts."""
    from training.drafters.eagle3 import attention, fold_triton
    g = torch.Generator(device="cuda").manual_seed(0)
    B, Hq, Hkv, L, D, S = 2, 8, 2, 300, 128, 3

    def rand(*shape, kind=dtype):
        return torch.randn(*shape, generator=g, device="cuda", dtype=kind)
    q = rand(B, L, Hq, D).transpose(1, 2)
    if padded:
        out = rand(B, Hq, L + 84, D)[:, :, :L]
        lse = rand(B, Hq, L + 84, kind=torch.float32)[:, :, :L]
    else:
        out, lse = rand(B, L, Hq, D).transpose(1, 2), rand(B, Hq, L, kind=torch.float32)
    keys, values = rand(S, B, Hkv, L, D), rand(S, B, Hkv, L, D)
    grad = rand(B, L, Hq, D).transpose(1, 2)
    want_o, want_p = attention._fold_forward(q, out, lse, keys, values)
    got_o, got_p = fold_triton.fold_forward(q, out, lse, keys, values)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(got_o.float(), want_o.float(), **tol)
    torch.testing.assert_close(got_p, want_p, rtol=1e-5, atol=1e-6)
    assert got_o.stride() == q.stride()
    want = attention._fold_backward(grad, q, out, want_p, keys, values)
    got = fold_triton.fold_backward(grad, q, out, want_p, keys, values)
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
        torch.testing.assert_close(a.float(), b.float(), **tol)
    assert got[0].stride() == q.stride()
    assert padded or got[1].stride() == out.stride()


@pytest.mark.parametrize("steps", [1, 3])
def test_diagonal_keys_extend_the_step0_softmax_exactly(steps):
    """flex's output and log-sum-exp over the step-0 keys, extended by with_diagonal_keys:
    the softmax over all the step's keys, values and gradients (lse's included)."""
    from training.drafters.eagle3.attention import with_diagonal_keys
    g = torch.Generator().manual_seed(steps)
    B, Hq, Hkv, L, D = 2, 4, 2, 40, 8
    doc_ids = random_docs(B, L, seed=steps)

    def rand(h):
        return torch.randn(B, h, L, D, generator=g, dtype=torch.float64, requires_grad=True)
    q, keys, values = rand(Hq), [rand(Hkv) for _ in range(steps + 1)], \
        [rand(Hkv) for _ in range(steps + 1)]
    k0, v0 = (t.repeat_interleave(Hq // Hkv, dim=1) for t in (keys[0], values[0]))
    scores = (q @ k0.transpose(-1, -2) / math.sqrt(D)).masked_fill(
        ~reference_mask(doc_ids, 1)[:, None], float("-inf"))
    lse = scores.logsumexp(-1)
    got = with_diagonal_keys(q, torch.softmax(scores, -1) @ v0, lse, keys[1:], values[1:])
    want = reference_ttt_attention(q, keys, values, doc_ids)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    inputs = [q, *keys, *values]
    upstream = torch.randn(got.shape, generator=g, dtype=torch.float64)
    for a, b in zip(torch.autograd.grad((got * upstream).sum(), inputs),
                    torch.autograd.grad((want * upstream).sum(), inputs)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.gpu
@pytest.mark.parametrize("L", [384, 300])  # 300: the row is padded to whole blocks
def test_flex_path_matches_dense_path_on_cuda(L):
    g = torch.Generator().manual_seed(L)
    B, Hq, Hkv, D = 2, 8, 2, 64
    doc_ids = random_docs(B, L, seed=L).cuda()

    def rand(h):
        return torch.randn(B, h, L, D, generator=g).cuda().requires_grad_()
    q = rand(Hq)
    keys, values = [rand(Hkv) for _ in range(3)], [rand(Hkv) for _ in range(3)]
    inputs = [q, *keys, *values]
    flex = ttt_attention(q, keys, values, DocLayout(doc_ids, use_flex=True))
    dense = ttt_attention(q, keys, values, DocLayout(doc_ids, use_flex=False))
    # float32 kernels with different summation orders (flex may use TF32 for its dots);
    # a masking error would be off by O(1).
    torch.testing.assert_close(flex, dense, rtol=5e-3, atol=5e-3)
    upstream = torch.randn(flex.shape, generator=g).cuda()
    for a, b in zip(torch.autograd.grad((flex * upstream).sum(), inputs),
                    torch.autograd.grad((dense * upstream).sum(), inputs)):
        torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-2)


@pytest.mark.gpu
def test_drafter_on_cuda_matches_cpu_and_trains_under_bf16(drafter, make_sample):
    samples = [make_sample(n, seed=i) for i, n in enumerate((100, 130, 60))]
    batch = collate([samples[:2], samples[2:]], 256)
    cpu = drafter(batch, TTT, DECAY, loss_chunk=64)
    model = drafter.float().cuda()
    gpu_batch = batch.to("cuda")
    gpu_batch.aux_hidden, gpu_batch.final_hidden = (gpu_batch.aux_hidden.float(),
                                                    gpu_batch.final_hidden.float())
    gpu = model(gpu_batch, TTT, DECAY, loss_chunk=64)
    assert gpu.positions == cpu.positions
    assert gpu.loss.item() == pytest.approx(cpu.loss.item(), rel=5e-3)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        bf16 = model(gpu_batch, TTT, DECAY, loss_chunk=64)
    bf16.loss.backward()
    assert bf16.loss.item() == pytest.approx(cpu.loss.item(), rel=0.05)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad)


@pytest.mark.gpu
def test_checkpointed_steps_on_cuda_match_under_bf16(drafter, make_sample):
    """The compiled islands and flex_attention inside a recomputed step: the same losses
    and gradients as the plain unroll on the GPU."""
    batch = collate([[make_sample(n, seed=i) for i, n in enumerate((100, 130))]], 256)
    model, gpu_batch = drafter.float().cuda(), batch.to("cuda")
    gpu_batch.aux_hidden, gpu_batch.final_hidden = (gpu_batch.aux_hidden.float(),
                                                    gpu_batch.final_hidden.float())
    results = []
    for checkpoint in (0, 2, TTT):
        model.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(gpu_batch, TTT, DECAY, loss_chunk=64, checkpoint=checkpoint)
        out.loss.backward()
        results.append((out.loss.item(), [p.grad.clone() for p in model.parameters()
                                          if p.requires_grad]))
    (plain, plain_grads), *checkpointed = results
    for kept, kept_grads in checkpointed:
        assert kept == pytest.approx(plain, rel=1e-6)
        for a, b in zip(kept_grads, plain_grads):
            torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-5)


def swiglu_down_inputs(device, dtype):
    g = torch.Generator().manual_seed(3)
    return [torch.randn(*shape, generator=g, dtype=dtype).to(device).requires_grad_()
            for shape in ((2, 5, 12), (2, 5, 12), (7, 12))]


def test_swiglu_down_recomputes_to_the_exact_gradients():
    from training.layers import SwiGLUDown
    assert torch.autograd.gradcheck(SwiGLUDown.apply, swiglu_down_inputs("cpu", torch.float64))


@pytest.mark.gpu
def test_swiglu_down_under_bf16_autocast_matches_plain_autograd():
    from training.layers import SwiGLUDown
    gate, up, weight = swiglu_down_inputs("cuda", torch.float32)
    upstream = torch.randn(2, 5, 7, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        got = SwiGLUDown.apply(gate, up, weight)
        want = torch.nn.functional.linear(torch.nn.functional.silu(gate) * up, weight)
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got, want)
    for a, b in zip(torch.autograd.grad((got * upstream).sum(), [gate, up, weight]),
                    torch.autograd.grad((want * upstream).sum(), [gate, up, weight])):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)


def test_config_round_trips_and_rejects_bad_shapes():
    from dataclasses import replace

    from training.config import PRESETS, DrafterConfig
    for cfg in PRESETS.values():
        assert DrafterConfig.from_dict(cfg.to_dict()) == cfg
    assert PRESETS["llama3-8b"].head_dim == 128
    assert PRESETS["kimi-k2"].head_dim == 128
    with pytest.raises(ValueError, match="num_kv_heads"):
        replace(PRESETS["tiny"], num_kv_heads=3)
    with pytest.raises(ValueError, match="draft_vocab_size"):
        replace(PRESETS["tiny"], draft_vocab_size=1000)
    with pytest.raises(ValueError, match="unknown drafter config keys: layers"):
        DrafterConfig.from_dict({**PRESETS["tiny"].to_dict(), "layers": 2})


def test_load_verifier_takes_the_target_head_rows_of_the_draft_vocab(tiny_cfg):
    from training.drafters.eagle3.model import Eagle3Drafter
    model = Eagle3Drafter(tiny_cfg)
    V, H, D = tiny_cfg.vocab_size, tiny_cfg.hidden_size, tiny_cfg.draft_vocab_size
    head = torch.randn(V, H)
    d2t = torch.arange(D) * 2
    model.load_verifier(torch.randn(V, H), head, d2t, torch.arange(V) % 2 == 0)
    assert torch.equal(model.target_head, head[::2])
    assert not model.embed_tokens.weight.requires_grad
    assert "target_head" not in model.state_dict()
    assert {"fc.weight", "midlayer.self_attn.q_proj.weight", "midlayer.hidden_norm.weight",
            "norm.weight", "lm_head.weight", "d2t", "t2d"} <= set(model.state_dict())
    with pytest.raises(ValueError, match="lm_head has shape"):
        model.load_verifier(torch.randn(V, H), head[:10], d2t, torch.ones(V, dtype=torch.bool))


def test_diagonal_fold_backward_is_the_gradient_of_its_forward():
    from training.drafters.eagle3.attention import with_diagonal_keys
    g = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64, requires_grad=True)
    B, Hq, Hkv, L, D = 1, 4, 2, 6, 4
    inputs = [rand(B, Hq, L, D), rand(B, Hq, L, D), rand(B, Hq, L)] + \
        [rand(B, Hkv, L, D) for _ in range(4)]
    assert torch.autograd.gradcheck(
        lambda q, out, lse, k1, k2, v1, v2: with_diagonal_keys(q, out, lse, [k1, k2], [v1, v2]),
        inputs)


def test_rope_rotates_as_the_verifiers_llama_layers_do():
    # An exported drafter runs under vLLM's Llama rotary embedding: the same rotation.
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama import modeling_llama

    from training.layers import rope, rotary_tables
    D, theta, L = 16, 500000.0, 40
    config = transformers.LlamaConfig(hidden_size=4 * D, num_attention_heads=4,
                                      head_dim=D, rope_theta=theta)
    positions = torch.cat([torch.arange(25), torch.arange(15) + 7])[None]
    x = torch.randn(1, 4, L, D, dtype=torch.float64)
    cos, sin = modeling_llama.LlamaRotaryEmbedding(config)(x, positions)
    want, _ = modeling_llama.apply_rotary_pos_emb(x, x, cos.double(), sin.double())
    got = rope(x.transpose(1, 2), *rotary_tables(positions, D, theta, torch.float64))
    torch.testing.assert_close(got.transpose(1, 2), want, rtol=1e-6, atol=1e-6)


def test_positions_found_on_the_host_score_what_the_drafter_finds_itself(drafter, make_sample):
    """The training step finds the scored positions on the host copy of the batch
    (scored_positions) and hands them over: the same losses as a pass that finds its own."""
    from training.drafters.eagle3.model import scored_positions
    batch = collate([[make_sample(100, 0), make_sample(130, 1)], [make_sample(60, 2)]], 256)
    positions = scored_positions(batch, TTT)
    assert sum(positions.counts) == positions.index.shape[0]
    own = drafter.step_losses(batch, TTT, loss_chunk=64)
    given = drafter.step_losses(batch, TTT, loss_chunk=64,
                                positions=positions.onto(torch.device("cpu")))
    for a, b in zip(own, given):
        assert torch.equal(a.index, b.index) and torch.equal(a.losses, b.losses)


@pytest.mark.gpu
@pytest.mark.parametrize("fp8", [False, True])
def test_an_eagle3_step_queues_its_forward_and_backward_without_reading_the_device(
        drafter, make_sample, fp8):
    """Given its batch's host copy, a step's unrolled forward and backward are queued
    with no read from the device (a read waits for all the GPU was given: the step
    before's optimizer)."""
    from training.drafters.eagle3.step import Unroll, forward_backward
    from training.drafters.eagle3.model import Eagle3Drafter
    model = Eagle3Drafter(drafter.cfg, fp8).cuda()
    model.load_state_dict(drafter.state_dict())
    host = collate([[make_sample(100, 0), make_sample(130, 1)], [make_sample(60, 2)]], 256)
    host.aux_hidden, host.final_hidden = host.aux_hidden.float(), host.final_hidden.float()
    batch = host.to("cuda")
    unroll = Unroll(model)
    forward_backward(unroll, batch, TTT, DECAY, 64, host=host)  # compiles: reads allowed
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        per_step, counts = forward_backward(unroll, batch, TTT, DECAY, 64, host=host)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert all(s.losses.isfinite().all() for s in per_step) and all(counts)
