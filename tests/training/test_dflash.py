"""The DFlash drafter on CPU: its attention mask, anchors, chunked loss, the trainer's
command line, a loss that falls on --synthetic, and resume after kill -9."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tests.training.test_checkpoint import after_start
from tests.waiting import niced
from training import checkpoint, durable
from training.flex import dense_attention
from training.cli import main
from training.config import DFLASH_PRESETS
from training.data import Dataset
from training.drafters.dflash.anchors import sample_anchors, valid_anchors
from training.drafters.dflash.loss import block_loss, verifier_tokens
from training.drafters.dflash.mask import BlockLayout, block_attention
from training.drafters.dflash.model import DFlashDrafter, plan_blocks
from training.drafters.dflash.step import DFlashTraining, step_fields
from training.loop import EXIT_OOM, TrainConfig, record_oom
from training.metrics import MetricsWriter
from training.packing import collate

ROOT = Path(__file__).resolve().parents[2]


def packed_rows(lengths_per_row, L, seed=0, hidden=4, vocab=50, layers=3):
    """A PackedBatch of random samples (float64), rows of L tokens."""
    g = torch.Generator().manual_seed(seed)

    def sample(n):
        return dict(input_ids=torch.randint(0, vocab, (n,), generator=g),
                    loss_mask=torch.rand(n, generator=g) > 0.25,
                    aux_hidden=torch.randn(n, layers * hidden, generator=g,
                                           dtype=torch.float64),
                    final_hidden=torch.randn(n, hidden, generator=g, dtype=torch.float64))
    return collate([[sample(n) for n in row] for row in lengths_per_row], L)


def reference_mask(doc_ids, anchors, block_size):
    """Who sees whom, written out a query and a key at a time."""
    B, L = doc_ids.shape
    A = anchors.shape[1]
    Q = A * block_size
    allowed = torch.zeros(B, Q, L + Q, dtype=torch.bool)
    for b in range(B):
        for slot in range(A):
            p = int(anchors[b, slot])
            for k in range(block_size):
                q = slot * block_size + k
                for j in range(p):  # context strictly before the anchor, same sample
                    allowed[b, q, j] = bool(doc_ids[b, j] == doc_ids[b, p])
                for k2 in range(block_size):  # its own block, both directions
                    allowed[b, q, L + slot * block_size + k2] = True
    return allowed


@pytest.mark.parametrize("block_size, max_anchors", [(2, 9), (4, 6), (5, 40)])
def test_the_mask_is_the_rule_on_packed_rows_with_several_samples(block_size, max_anchors):
    torch.manual_seed(block_size)
    batch = packed_rows([[13, 9, 20], [30, 11], [6, 4]], 48)
    anchors, used = sample_anchors(batch.loss_mask, batch.doc_ids, block_size, max_anchors)
    assert used[:2].sum(1).min() >= 2 and (~used).any()  # several blocks; spare slots too
    layout = BlockLayout(batch.doc_ids, anchors, block_size, use_flex=False)
    assert torch.equal(layout.mask, reference_mask(batch.doc_ids, anchors, block_size))


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_with_the_block_mask_matches_the_dense_mask_on_cpu():
    # flex_attention runs eagerly (forward only) on CPU: this checks the BlockMask that
    # the CUDA path builds from the same rule.
    torch.manual_seed(0)
    block_size = 4
    batch = packed_rows([[50, 40, 60], [100, 30]], 150)
    anchors, _ = sample_anchors(batch.loss_mask, batch.doc_ids, block_size, 24)
    Q, L = anchors.shape[1] * block_size, 150
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, Q, 16, generator=g)
    k, v = (torch.randn(2, 2, L + Q, 16, generator=g) for _ in range(2))
    flex = block_attention(q, k, v, BlockLayout(batch.doc_ids, anchors, block_size,
                                                use_flex=True))
    dense = dense_attention(q, k, v, reference_mask(batch.doc_ids, anchors, block_size))
    torch.testing.assert_close(flex, dense, rtol=1e-5, atol=1e-5)


def expand_block_mask(mask, rule, B, Q, KV):
    """Element by element what flex computes with a BlockMask: every pair in a full block,
    the rule's pairs in a partial block, nothing elsewhere."""
    n = mask.BLOCK_SIZE[0]
    seen = torch.zeros(B, Q, KV, dtype=torch.bool)
    b, q, kv = (torch.arange(B)[:, None, None], torch.arange(Q)[None, :, None],
                torch.arange(KV)[None, None])
    allowed = rule(b, None, q, kv)
    for counts, indices, full in ((mask.kv_num_blocks, mask.kv_indices, False),
                                  (mask.full_kv_num_blocks, mask.full_kv_indices, True)):
        for row in range(B):
            for qb in range(counts.shape[-1]):
                for kb in indices[row, 0, qb, :counts[row, 0, qb]].tolist():
                    rows, cols = slice(qb * n, (qb + 1) * n), slice(kb * n, (kb + 1) * n)
                    seen[row, rows, cols] |= True if full else allowed[row, rows, cols]
    return seen


@pytest.mark.parametrize("block_size, max_anchors, lengths, L",
                         [(16, 24, [[200, 150, 162], [300, 90]], 512),
                          (24, 12, [[150, 140, 110], [390]], 400),
                          (5, 40, [[13, 9, 20], [30, 11]], 48)])
def test_the_block_mask_built_from_ranges_covers_exactly_the_rule(block_size, max_anchors,
                                                                   lengths, L):
    """The CUDA path's BlockMask, built from the slots' context ranges: its full blocks
    hold only allowed pairs and its blocks (full and partial) every allowed pair, on rows
    whose length and block size are not whole flex blocks."""
    from training.drafters.dflash.mask import block_mask, block_mask_mod
    torch.manual_seed(block_size)
    batch = packed_rows(lengths, L)
    anchors, used = sample_anchors(batch.loss_mask, batch.doc_ids, block_size, max_anchors)
    Q = anchors.shape[1] * block_size
    mask = block_mask(batch.doc_ids, anchors, block_size)
    seen = expand_block_mask(mask, block_mask_mod(batch.doc_ids, anchors, block_size),
                             len(lengths), Q, L + Q)
    assert torch.equal(seen, reference_mask(batch.doc_ids, anchors, block_size))


def test_anchors_are_distinct_valid_positions_drawn_at_random():
    batch = packed_rows([[20, 3, 25], [40, 8]], 64)
    valid = valid_anchors(batch.loss_mask, batch.doc_ids, 6)
    for b in range(2):  # valid: bears loss, and the block's 6 tokens are one sample's
        for p in range(64):
            fits = p + 5 < 64 and bool((batch.doc_ids[b, p:p + 6] == batch.doc_ids[b, p]).all())
            expect = fits and bool(batch.loss_mask[b, p]) and int(batch.doc_ids[b, p]) >= 0
            assert bool(valid[b, p]) == expect, (b, p)
    seen = torch.zeros(2, 64)
    for seed in range(30):
        torch.manual_seed(seed)
        anchors, used = sample_anchors(batch.loss_mask, batch.doc_ids, 6, 5)
        for b in range(2):
            picked = anchors[b][used[b]]
            assert len(picked) == min(5, int(valid[b].sum()))
            assert picked.tolist() == sorted(set(picked.tolist()))  # distinct, in order
            assert valid[b, picked].all() and not used[b, len(picked):].any()
            seen[b, picked] += 1
    assert (seen[valid] > 0).all()  # every valid position is drawn some time
    with pytest.raises(ValueError, match="max_anchors"):
        sample_anchors(batch.loss_mask, batch.doc_ids, 6, 65)


def test_ranks_draw_the_anchors_one_process_draws_for_the_global_batch():
    batch = packed_rows([[20, 30], [50], [10, 25, 15], [45]], 50)
    mask, doc = batch.loss_mask, batch.doc_ids
    torch.manual_seed(7)
    whole = sample_anchors(mask, doc, 4, 6)
    for rank in range(2):
        torch.manual_seed(7)
        mine = sample_anchors(mask[2 * rank:2 * rank + 2], doc[2 * rank:2 * rank + 2], 4, 6,
                              share=(rank, 2))
        for got, expect in zip(mine, whole):
            assert torch.equal(got, expect[2 * rank:2 * rank + 2])


def unchunked_loss(hidden, head, target_hidden, weights, soft_kl):
    logits, target_logits = hidden @ head.T, target_hidden @ head.T
    ce = F.cross_entropy(logits, target_logits.argmax(-1), reduction="none")
    kl = F.kl_div(logits.log_softmax(-1), target_logits.log_softmax(-1), log_target=True,
                  reduction="none").sum(-1)
    losses = (1 - soft_kl) * ce + soft_kl * kl
    return (weights * losses).sum(), losses


@pytest.mark.parametrize("soft_kl", [0.0, 0.15, 1.0])
@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_chunked_ce_and_kl_equal_the_unchunked_loss_and_gradients(soft_kl, chunk):
    g = torch.Generator().manual_seed(2)
    P, H, V = 37, 16, 300
    hidden = torch.randn(P, H, generator=g, dtype=torch.float64, requires_grad=True)
    head = torch.randn(V, H, generator=g, dtype=torch.float64)
    target_hidden = torch.randn(P, H, generator=g, dtype=torch.float64)
    weights = torch.rand(P, generator=g, dtype=torch.float64)
    total, losses, agree = block_loss(hidden, head, target_hidden, weights, soft_kl, chunk)
    (grad,) = torch.autograd.grad(3.0 * total, hidden)
    ref_total, ref_losses = unchunked_loss(hidden, head, target_hidden, weights, soft_kl)
    (ref_grad,) = torch.autograd.grad(3.0 * ref_total, hidden)
    torch.testing.assert_close(total, ref_total)
    torch.testing.assert_close(losses, ref_losses.detach())
    torch.testing.assert_close(grad, ref_grad)
    expect = (hidden @ head.T).argmax(-1) == (target_hidden @ head.T).argmax(-1)
    assert torch.equal(agree, expect)


def test_the_verifier_tokens_score_as_its_hidden_states_do_without_the_kl():
    """Without the soft KL the drafter hands block_loss the verifier's tokens, each
    distinct row's made once (rows repeat: blocks overlap): the same loss, gradient and
    agreement as from the hidden states, whose argmax the chunks take."""
    g = torch.Generator().manual_seed(5)
    N, H, V, P = 40, 16, 300, 90
    final = torch.randn(N, H, generator=g, dtype=torch.float64)
    rows = torch.randint(0, N, (P,), generator=g)
    head = torch.randn(V, H, generator=g, dtype=torch.float64)
    hidden = torch.randn(P, H, generator=g, dtype=torch.float64, requires_grad=True)
    weights = torch.rand(P, generator=g, dtype=torch.float64)
    tokens = verifier_tokens(final, torch.unique(rows, return_inverse=True), head,
                             torch.float64, chunk=7)
    assert torch.equal(tokens, (final[rows] @ head.T).argmax(-1))
    by_tokens = block_loss(hidden, head, tokens, weights, 0.0, 16)
    by_states = block_loss(hidden, head, final[rows], weights, 0.0, 16)
    for a, b in zip(by_tokens, by_states):
        torch.testing.assert_close(a, b)
    grads = [torch.autograd.grad(out[0], hidden)[0] for out in (by_tokens, by_states)]
    torch.testing.assert_close(*grads)
    with pytest.raises(ValueError, match="soft KL"):
        block_loss(hidden, head, tokens, weights, 0.15, 16)


@pytest.mark.parametrize("soft_kl", [0.0, 0.15])
def test_the_loss_holds_a_few_chunks_of_logits_never_all_positions(peak_allocated_bytes,
                                                                    soft_kl):
    g = torch.Generator().manual_seed(3)
    P, H, V, chunk = 2048, 16, 2048, 32
    hidden = torch.randn(P, H, generator=g, requires_grad=True)
    head, target_hidden = torch.randn(V, H, generator=g), torch.randn(P, H, generator=g)
    weights = torch.ones(P)

    def run():
        total, _, _ = block_loss(hidden, head, target_hidden, weights, soft_kl, chunk)
        total.backward()
    # float32 chunk × V tensors alive at once (measured: 4.6), where the float32 logits of
    # every position would be 64 of them
    assert peak_allocated_bytes(run) < 6 * chunk * V * 4


def spied_drafter(monkeypatch):
    """tiny_drafter_and_rows, and the list that records each target block_loss is handed."""
    import training.drafters.dflash.model as model_module

    seen = []

    def spy(hidden, head, target, *args):
        seen.append(target)
        return block_loss(hidden, head, target, *args)
    monkeypatch.setattr(model_module, "block_loss", spy)
    return *tiny_drafter_and_rows(), seen


def tiny_drafter_and_rows():
    """The tiny drafter (float64, a random verifier's embedding and head) and two packed
    rows of three samples."""
    cfg = DFLASH_PRESETS["tiny"]
    torch.manual_seed(0)
    drafter = DFlashDrafter(cfg).double()
    g = torch.Generator().manual_seed(4)
    V, H = cfg.vocab_size, cfg.hidden_size
    drafter.load_verifier(torch.randn(V, H, generator=g, dtype=torch.float64),
                          torch.randn(V, H, generator=g, dtype=torch.float64))
    return drafter, packed_rows([[40, 50], [90]], 96, hidden=H, vocab=V - 1)


def scored_positions(batch, block_size: int, max_anchors: int, seed: int):
    """(row, anchor, offset) of every position a pass seeded with `seed` scores: offsets
    1..block_size - 1 of every used block whose token bears loss, block by block."""
    torch.manual_seed(seed)
    anchors, used = sample_anchors(batch.loss_mask, batch.doc_ids, block_size, max_anchors)
    return [(b, int(a), k) for b in range(anchors.shape[0])
            for a, u in zip(anchors[b], used[b]) if u
            for k in range(1, block_size) if batch.loss_mask[b, a + k]]


def test_the_drafter_scores_each_block_offset_against_the_verifier_token(monkeypatch):
    drafter, batch, seen = spied_drafter(monkeypatch)
    torch.manual_seed(5)
    out = drafter(batch, batch.aux_hidden, 12, gamma=2.0, soft_kl=0.15, loss_chunk=16)
    # each scored against the verifier's state at the position before its token (which
    # predicts it)
    expect = scored_positions(batch, drafter.cfg.block_size, 12, seed=5)
    assert out.offset.tolist() == [k for _, _, k in expect]
    assert torch.equal(seen[0],
                       torch.stack([batch.final_hidden[b, a + k - 1] for b, a, k in expect]))
    weights = torch.exp(-(out.offset - 1) / 2.0).double()
    assert out.total.item() == pytest.approx((weights * out.losses).sum().item())
    grads = torch.autograd.grad(out.total, [p for p in drafter.parameters()])
    assert all(gr.abs().sum() > 0 for gr in grads)  # every weight of the drafter learns
    assert not drafter.embed_tokens.requires_grad and not drafter.lm_head.requires_grad


def test_the_drafter_takes_the_extracted_verifier_tokens_without_the_kl(monkeypatch):
    """Data that carries the verifier's argmax (extract keeps it) is scored against those
    tokens, gathered at the position before each drafted token; data that lacks it gets
    the same tokens made from the final hidden states: the same losses either way."""
    drafter, batch, seen = spied_drafter(monkeypatch)
    assert batch.verifier_ids is None  # samples without them pack without them
    outs = []
    for ids in (None, (batch.final_hidden @ drafter.lm_head.T).argmax(-1)):
        batch.verifier_ids = ids
        torch.manual_seed(5)
        outs.append(drafter(batch, batch.aux_hidden, 12, gamma=2.0, loss_chunk=16))
    assert torch.equal(seen[0], seen[1]) and seen[1].dtype == torch.long
    torch.testing.assert_close(outs[0].losses, outs[1].losses)
    # the stored tokens are what is scored, not a recomputation
    g = torch.Generator().manual_seed(6)
    batch.verifier_ids = torch.randint(0, drafter.cfg.vocab_size, batch.input_ids.shape,
                                       generator=g)
    torch.manual_seed(5)
    out = drafter(batch, batch.aux_hidden, 12, gamma=2.0, loss_chunk=16)
    expect = scored_positions(batch, drafter.cfg.block_size, 12, seed=5)
    assert out.offset.tolist() == [k for _, _, k in expect]
    assert seen[2].tolist() == [int(batch.verifier_ids[b, a + k - 1]) for b, a, k in expect]


def test_a_plan_made_on_the_host_drafts_and_scores_what_the_drafter_draws_itself():
    """The training step draws the anchors on the host copy of the batch (plan_blocks) and
    hands them over: the same seed gives the same positions, targets and losses as a pass
    that draws its own."""
    drafter, batch = tiny_drafter_and_rows()
    torch.manual_seed(5)
    own = drafter(batch, batch.aux_hidden, 12, gamma=2.0, loss_chunk=16)
    torch.manual_seed(5)
    plan = plan_blocks(batch, drafter.cfg.block_size, 12)
    assert plan.counts == own.counts and sum(plan.counts) == plan.offset.shape[0]
    distinct, where = plan.distinct_verifier_rows  # the batch carries no verifier tokens
    assert torch.equal(distinct[where], plan.verifier_rows)
    with_kl = plan_blocks(batch, drafter.cfg.block_size, 12, soft_kl=0.15)
    assert with_kl.distinct_verifier_rows is None
    planned = drafter(batch, batch.aux_hidden, 12, gamma=2.0, loss_chunk=16,
                      plan=plan.onto(torch.device("cpu")))
    assert torch.equal(planned.offset, own.offset)
    assert torch.equal(planned.losses, own.losses) and torch.equal(planned.agree, own.agree)


@pytest.mark.gpu
@pytest.mark.parametrize("fp8", [False, True])
def test_a_dflash_step_queues_its_forward_and_backward_without_reading_the_device(fp8):
    """Given its batch's host copy, a step's forward and backward are queued with no read
    from the device (a read waits for all the GPU was given: the step before's
    optimizer), here where it also makes the verifier's tokens; its anchors are the host's
    draw."""
    from training.drafters.dflash.step import DFlashStep, forward_backward
    tiny, host = tiny_drafter_and_rows()
    cfg = tiny.cfg
    drafter = DFlashDrafter(cfg, fp8).cuda()
    drafter.load_verifier(tiny.embed_tokens.float(), tiny.lm_head.float())
    training = DFlashTraining(target_layers=(0, 1, 2), max_anchors=12, gamma=2.0, soft_kl=0.0)
    step = DFlashStep(drafter, training, [0, 1, 2])
    host.aux_hidden, host.final_hidden = host.aux_hidden.float(), host.final_hidden.float()
    batch = host.to("cuda")
    forward_backward(step, batch, cfg, training, 16, host=host)  # compiles: reads allowed
    torch.cuda.synchronize()
    torch.manual_seed(5)
    torch.cuda.set_sync_debug_mode("error")
    try:
        per_offset, counts = forward_backward(step, batch, cfg, training, 16, host=host)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.manual_seed(5)
    assert counts == [float(n) for n in plan_blocks(host, cfg.block_size, 12).counts]
    assert all(o.losses.isfinite().all() for o in per_offset)


def test_tau_is_the_expected_accepted_length():
    cfg = DFLASH_PRESETS["tiny"]
    training = DFlashTraining((2, 4, 5), 8, gamma=1.0, soft_kl=0.0)
    acc = [0.9, 0.5, 0.5, 0.0, 1.0, 1.0, 1.0]
    fields = step_fields([1.0] * 7, acc, [10.0] * 7, cfg, training)
    assert fields["tau"] == pytest.approx(0.9 + 0.45 + 0.225)
    assert fields["loss"] == pytest.approx(1.0)


def test_an_oom_names_the_block_size_and_anchors_and_the_writer_checks_dflash_steps(
        tmp_path, capsys):
    cfg = TrainConfig(data=tmp_path, run_dir=tmp_path, drafter=DFLASH_PRESETS["story"],
                      max_seq_len=24576,
                      dflash=DFlashTraining((2, 30, 58), 1024, gamma=10.0, soft_kl=0.15))
    metrics = MetricsWriter(tmp_path / "metrics.jsonl")
    error = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 11.37 GiB.")
    assert record_oom(metrics, cfg, torch.device("cpu"), error) == EXIT_OOM
    oom = read_events(tmp_path)[0]
    assert oom == {**oom, "event": "oom", "max_seq_len": 24576, "ttt_steps": None,
                   "block_size": 24, "max_anchors": 1024, "tried_gib": 11.37}
    assert "block_size=24 max_anchors=1024" in capsys.readouterr().err
    step = dict(step=1, epoch=0, loss=1.0, loss_pos=[1.0], acc_pos=[0.5], lr=1e-4,
                grad_norm=1.0, tokens=10, tokens_per_s=1.0, samples_per_row=1.0,
                pad_frac=0.0, peak_mem_gib=1.0)
    with pytest.raises(ValueError, match="tau"):
        metrics.write("step", **step)
    with pytest.raises(ValueError):  # one drafter's fields or the other's, not both
        metrics.write("step", **step, tau=0.5, loss_ttt=[1.0], acc_ttt=[0.5])
    metrics.write("step", **step, tau=0.5)


@pytest.mark.parametrize("args, flag", [
    (["--block-size", "0"], "--block-size"),
    (["--block-size", "1"], "--block-size"),
    (["--block-size", "300", "--max-seq-len", "256"], "--block-size"),
    (["--max-anchors", "0"], "--max-anchors"),
    (["--max-anchors", "257", "--max-seq-len", "256"], "--max-anchors"),
    (["--target-layers", "2,4,99"], "--target-layers"),
    (["--target-layers", "-1"], "--target-layers"),
    (["--target-layers", "1,2"], "--target-layers"),  # the verifier's, not in the data
    (["--target-layers", "2,2"], "--target-layers"),
    (["--soft-kl", "1.5"], "--soft-kl"),
    (["--soft-kl", "-0.1"], "--soft-kl"),
    (["--dflash-gamma", "0"], "--dflash-gamma"),
    (["--num-layers", "0"], "--num-layers"),
    (["--preset", "llama3-8b"], "--preset"),
    (["--freeze-lm-head"], "--freeze-lm-head"),
])
def test_bad_dflash_values_exit_2_naming_the_flag(args, flag, capsys, cache, tmp_path):
    code = None
    try:
        code = main(["train", "--synthetic", "--drafter", "dflash", "--out",
                     str(tmp_path / "run"), *args])
    except SystemExit as exc:
        code = exc.code
    assert code == 2
    assert flag in capsys.readouterr().err


def test_dflash_flags_need_the_dflash_drafter(capsys, cache, tmp_path):
    assert main(["train", "--synthetic", "--block-size", "4", "--out",
                 str(tmp_path / "run")]) == 2
    assert "--block-size" in capsys.readouterr().err


def test_extract_captures_five_layers_that_dflash_reads_and_eagle3_refuses(
        tmp_path, capsys):
    from transformers import LlamaConfig, LlamaForCausalLM

    from training.extract import extract

    cfg = DFLASH_PRESETS["tiny"]
    torch.manual_seed(0)
    verifier = LlamaForCausalLM(LlamaConfig(
        hidden_size=cfg.hidden_size, intermediate_size=128, num_hidden_layers=10,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=cfg.vocab_size)).eval()
    g = torch.Generator().manual_seed(1)
    samples = [(torch.randint(0, 500, (n,), generator=g).tolist(), [True] * n)
               for n in (40, 60, 30, 50)]
    data = tmp_path / "data"
    extract(verifier, samples, data, layers=[1, 3, 5, 7, 8], log=lambda line: None)
    head = verifier.get_output_embeddings().weight
    for i, (ids, _) in enumerate(samples):  # the verifier's argmax, kept beside its states
        sample = Dataset(data)[i]
        assert sample["verifier_ids"].tolist() == \
            (sample["final_hidden"] @ head.T).argmax(-1).tolist()
    common = ["train", "--data", str(data), "--steps", "2", "--max-seq-len", "128"]
    assert main([*common, "--drafter", "dflash", "--max-anchors", "8",
                 "--out", str(tmp_path / "five")]) == 0
    assert read_events(tmp_path / "five")[0]["config"]["model"]["num_target_layers"] == 5
    assert main([*common, "--drafter", "dflash", "--max-anchors", "8", "--target-layers",
                 "8,1,5", "--out", str(tmp_path / "three")]) == 0
    capsys.readouterr()
    assert main([*common, "--out", str(tmp_path / "eagle")]) == 2
    err = capsys.readouterr().err
    assert "--data" in err and "3 verifier layers" in err


def read_events(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


FAST = ["train", "--synthetic", "--drafter", "dflash", "--max-seq-len", "256",
        "--max-anchors", "64", "--block-size", "4", "--dflash-gamma", "0.5", "--lr", "1e-2",
        "--soft-kl", "0.15"]


def test_the_loss_falls_on_synthetic_and_step_events_carry_each_block_offset(
        cache, tmp_path):
    run_dir = tmp_path / "run"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls gain nothing from more threads
    try:
        assert main([*FAST, "--steps", "100", "--out", str(run_dir),
                     "--save-every", "0"]) == 0
    finally:
        torch.set_num_threads(threads)
    events = read_events(run_dir)
    assert [e["event"] for e in events][::len(events) - 1] == ["start", "end"]
    assert events[0]["config"]["dflash"]["max_anchors"] == 64
    steps = [e for e in events if e["event"] == "step"]
    assert [e["step"] for e in steps] == list(range(1, 101))
    for e in steps:
        assert "loss_ttt" not in e and "acc_ttt" not in e
        assert len(e["loss_pos"]) == len(e["acc_pos"]) == 3  # offsets 1..3 of a block of 4
        assert all(0 <= a <= 1 for a in e["acc_pos"])
        run, tau = 1.0, 0.0
        for a in e["acc_pos"]:
            run *= a
            tau += run
        assert e["tau"] == pytest.approx(tau)
        assert min(e["loss_pos"]) <= e["loss"] <= max(e["loss_pos"])
    first = sum(e["loss"] for e in steps[:20]) / 20
    last = sum(e["loss"] for e in steps[-20:]) / 20
    assert last <= 0.8 * first, (first, last)
    assert steps[-1]["tau"] > steps[0]["tau"]


@pytest.mark.slow
def test_resume_after_kill_9_continues_exactly(cache, tmp_path):
    environ = {**os.environ, "XDG_CACHE_HOME": str(cache), "OMP_NUM_THREADS": "1"}
    run_dir, ckpt = tmp_path / "run", tmp_path / "run" / "checkpoints"

    def start(*extra):
        return subprocess.Popen(niced([sys.executable, "-m", "training", *FAST, "--steps", "1000",
                                       "--save-every", "3", "--out", str(run_dir), *extra]),
                                cwd=ROOT, env=environ, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
    proc = start()
    # Killed a step after a checkpoint, so the resumed run redoes steps it had logged.
    steps = lambda: [e["step"] for e in read_events(run_dir) if e["event"] == "step"]  # noqa: E731
    assert after_start(run_dir, lambda: (s := steps()) and s[-1] > 3 and s[-1] % 3 == 1, 60)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    found = checkpoint.latest(ckpt)
    saved_step = int(found.name.removeprefix("step-"))
    before = len(read_events(run_dir))
    proc = start("--resume")
    assert after_start(run_dir, lambda: sum(e["event"] == "step" for e in read_events(run_dir)[before:])
                       >= 4, 60, before), proc.stderr
    proc.send_signal(signal.SIGTERM)  # stages its state, hands it to its writer, exits 0
    assert proc.wait(timeout=60) == 0
    durable.wait_for_writer(ckpt, print, timeout_s=60)  # the checkpoint, durable after the exit
    events = read_events(run_dir)
    last_step = max(e["step"] for e in events if e["event"] == "step")
    ends = [e for e in events if e["event"] == "end"]  # the writer's checkpoint event may follow
    assert ends[-1]["status"] == "stopped" and events.index(ends[-1]) > max(
        i for i, e in enumerate(events) if e["event"] == "step")
    assert checkpoint.latest(ckpt).name == f"step-{last_step}"
    resumed = events[before:]
    assert resumed[0]["event"] == "start"
    assert resumed[0]["config"]["resumed_from_step"] == saved_step
    assert resumed[1]["event"] == "step" and resumed[1]["step"] == saved_step + 1
    # A step redone after the kill repeats its loss: model, optimizer, data position and
    # the anchors' RNG all came back.
    first_run = {e["step"]: e for e in events[:before] if e["event"] == "step"}
    redone = [e for e in resumed if e["event"] == "step" and e["step"] in first_run]
    assert redone
    for e in redone:
        assert e["loss"] == pytest.approx(first_run[e["step"]]["loss"], rel=1e-6)
        assert e["acc_pos"] == pytest.approx(first_run[e["step"]]["acc_pos"])


@pytest.mark.gpu
def test_flex_path_matches_the_dense_path_on_cuda():
    """The compiled BlockMask and flex_attention against the dense rule, forward and
    backward, on rows whose lengths are not whole flex blocks."""
    torch.manual_seed(0)
    block_size = 16
    batch = packed_rows([[300, 200, 180], [500, 90]], 700).to("cuda")
    anchors, _ = sample_anchors(batch.loss_mask, batch.doc_ids, block_size, 50)
    Q, L = anchors.shape[1] * block_size, 700
    g = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(2, 8, Q, 64, generator=g, device="cuda", requires_grad=True)
    k, v = (torch.randn(2, 2, L + Q, 64, generator=g, device="cuda", requires_grad=True)
            for _ in range(2))
    outs = [block_attention(q, k, v, BlockLayout(batch.doc_ids, anchors, block_size,
                                                 use_flex=flex)) for flex in (True, False)]
    # float32 kernels with different summation orders (flex may use TF32 for its dots)
    torch.testing.assert_close(outs[0], outs[1], rtol=5e-3, atol=5e-3)
    upstream = torch.randn(outs[0].shape, generator=g, device="cuda")
    for a, b in zip(torch.autograd.grad((outs[0] * upstream).sum(), (q, k, v)),
                    torch.autograd.grad((outs[1] * upstream).sum(), (q, k, v))):
        torch.testing.assert_close(a, b, rtol=5e-3, atol=5e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("soft_kl", [0.0, 0.15])
@pytest.mark.parametrize("V", [300, 151_936])
def test_the_triton_chunk_pass_matches_the_reference_on_cuda(dtype, soft_kl, V):
    """training/drafters/dflash/loss_triton.py (what CUDA runs) against a float64 reference on the
    same logits (made in dtype, as the trainer makes them: bf16 rounding moves near-tied
    argmaxes, so the reference must see the same numbers): loss, gradient and agreement,
    on vocabularies below and far above one Triton block."""
    g = torch.Generator(device="cuda").manual_seed(4)
    P, H, chunk = 300, 64, 128
    hidden = torch.randn(P, H, generator=g, device="cuda").to(dtype).requires_grad_()
    head = (torch.randn(V, H, generator=g, device="cuda") * 0.5).to(dtype)
    target_hidden = torch.randn(P, H, generator=g, device="cuda").to(dtype)
    weights = torch.rand(P, generator=g, device="cuda")
    # without the KL the drafter passes the verifier's tokens (the kernel's other mode)
    target = target_hidden if soft_kl else verifier_tokens(
        target_hidden, torch.unique(torch.arange(P, device="cuda"), return_inverse=True),
        head, dtype)
    total, losses, agree = block_loss(hidden, head, target, weights, soft_kl, chunk)
    (grad,) = torch.autograd.grad(total, hidden)
    z = (hidden.detach() @ head.T).double()
    t = (target_hidden @ head.T).double()
    theirs = t.argmax(-1)
    log_p, log_q = z.log_softmax(-1), t.log_softmax(-1)
    ref_losses = -(1 - soft_kl) * log_p.gather(-1, theirs[:, None]).squeeze(-1) \
        + soft_kl * (log_q.exp() * (log_q - log_p)).sum(-1)
    d_z = log_p.exp() - (1 - soft_kl) * F.one_hot(theirs, V) - soft_kl * log_q.exp()
    ref_grad = (weights.double()[:, None] * d_z) @ head.double()
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-4  # the gradient's matmul runs in dtype
    torch.testing.assert_close(losses.double(), ref_losses, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(grad.double(), ref_grad, rtol=tol, atol=tol)
    assert torch.equal(agree, z.argmax(-1) == theirs)
