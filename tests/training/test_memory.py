"""The memory model's behaviour: the real drafter's parameters and state on the CPU, how
each term group grows with the step's shape, calibration, the largest fitting step and a
run's metrics. Its accuracy against measured H200 peaks is test_memory_measured.py's."""
from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path

import pytest
import torch

from training.drafters.eagle3 import memory
from training.drafters.eagle3 import model as model_module
from training.config import PRESETS
from training.drafters.eagle3.memory import Calibration, GiB, Measurement, StepShape
from training.drafters.eagle3.model import Eagle3Drafter
from training.drafters.eagle3.probe import Trainer, count_saved_bytes, random_batch, state_tensors

TINY = PRESETS["tiny"]  # H 64, 4 heads of 16, 2 KV heads, MLP 192, vocab 512, draft 256
RESULTS = Path(__file__).resolve().parents[2] / "bench/results"


def test_parameter_counts_are_the_real_drafters():
    counts = memory.parameter_counts(TINY)
    model = Eagle3Drafter(TINY)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    frozen = model.embed_tokens.weight.numel() + model.target_head.numel()
    assert (trainable, frozen) == (counts["trainable"], counts["frozen"])
    # autocast caches a copy of every matmul's weight: every trainable weight but the
    # norms' and the draft head's (the loss casts that one itself)
    matmuls = sum(p.numel() for name, p in model.named_parameters()
                  if p.requires_grad and p.dim() == 2 and not name.startswith("lm_head"))
    assert counts["autocast_cached"] == matmuls

    # --freeze-lm-head: the draft head leaves the trained ones and is the target head
    model.freeze_lm_head()
    held = memory.parameter_counts(TINY, freeze_lm_head=True)
    assert held["trainable"] == sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert held["frozen"] == frozen
    assert model.lm_head.weight.data_ptr() == model.target_head.data_ptr()


def test_a_frozen_head_takes_no_gradient_memory_and_no_cast_under_bf16():
    plain = memory.analytic_phases(TINY, StepShape(256, 3))
    frozen = memory.analytic_phases(TINY, StepShape(256, 3, freeze_lm_head=True))
    head_only = {"lm_head_step_grads", "lm_head_grad", "loss_head_casts"}
    for phase in frozen:  # the second-last step's fold only with every step recomputed
        names = set(frozen[phase]["constant"])
        assert not names & head_only, phase
        assert names | head_only >= set(plain[phase]["constant"])
    # in fp32 the verifier's bf16 head is cast for the loss, as a trained fp32 head is not
    fp32 = memory.analytic_phases(TINY, StepShape(256, 3, precision="fp32",
                                                  freeze_lm_head=True))
    head = Eagle3Drafter(TINY).target_head
    assert fp32["loss_forward"]["constant"]["loss_head_casts"] == head.numel() * 4


@pytest.mark.parametrize("freeze_lm_head", [False, True])
def test_the_optimizer_step_holds_the_real_trainers_state_and_batch(freeze_lm_head):
    """The optimizer phase against the tensors the CPU trainer holds when AdamW steps:
    parameters, gradients, AdamW's two moments, the verifier's tensors, and the batch,
    counted by their nbytes (AdamW's per-parameter step counters, a few bytes, aside)."""
    trainer = Trainer(TINY, torch.device("cpu"), freeze_lm_head=freeze_lm_head)
    L, K = 128, 2
    batch = random_batch(TINY, L, 1, torch.device("cpu"), torch.float32)
    trainer.forward_backward(batch, K, loss_chunk=128)
    trainer.optimizer_step()  # AdamW's state exists from the first step on
    trainer.forward_backward(batch, K, loss_chunk=128)  # the gradients the next step reads
    # by storage: a frozen draft head is the verifier's head, one tensor under two names
    tensors = {t.untyped_storage().data_ptr(): t for t in state_tensors(trainer) + [
        batch.input_ids, batch.position_ids, batch.doc_ids, batch.loss_mask,
        batch.aux_hidden, batch.final_hidden]}
    held = sum(t.nbytes for t in tensors.values())
    predicted = memory.predict(TINY, StepShape(L, K, precision="fp32",
                                               freeze_lm_head=freeze_lm_head))
    assert predicted.optimizer_step == pytest.approx(held, rel=1e-3)


def _groups(shape: StepShape, phase: str = "loss_backward") -> dict[str, int]:
    return dict(zip(memory.GROUPS, memory.group_totals(TINY, shape)[
        memory.PHASES.index(phase)]))


@pytest.mark.parametrize("phase", memory.PHASES)
def test_each_group_grows_as_its_name_says(phase):
    """T tokens (rows × max_seq_len) and K TTT steps: constant bytes do not move with T
    (the draft head's gradient per TTT step moves them with K), per_token ones are linear in T alone, per_step ones linear in T and in K, the
    diagonal's ∝ T·K(K-1)/2 (step k folds k diagonal keys), none at K = 1."""
    # the second-last step's fold backward: with every step recomputed, from 3 steps on
    pending = phase == "fold_backward_pending"

    def at(length, k, rows=1):
        return _groups(StepShape(length, k, batch_rows=rows, loss_chunk=128,
                                 checkpoint_ttt=k if pending else 0), phase)

    base = at(256, 3)
    assert at(512, 3)["constant"] == at(256, 3, rows=2)["constant"] == base["constant"]
    for group in ("per_token", "per_step", "diagonal"):
        assert at(512, 3)[group] == at(256, 3, rows=2)[group] == 2 * base[group], group
    assert at(256, 7)["per_token"] == base["per_token"]
    steps = [at(256, k)["per_step"] for k in range(3 if pending else 2, 7)]
    slopes = {b - a for a, b in pairwise(steps)}
    assert len(slopes) == 1 and slopes.pop() > 0
    assert at(256, 1)["diagonal"] == 0
    assert [at(256, k)["diagonal"] for k in (2, 3, 4, 5)] == [
        base["diagonal"] * n // 3 for n in (1, 3, 6, 10)]


def test_the_peak_grows_with_rows_length_and_ttt_steps():
    for cfg in (TINY, PRESETS["llama3-8b"]):
        by_length = [memory.predict(cfg, StepShape(n, 5)).total
                     for n in (1024, 2048, 4096, 8192, 16384)]
        by_ttt = [memory.predict(cfg, StepShape(8192, k)).total for k in range(1, 9)]
        by_rows = [memory.predict(cfg, StepShape(2048, 5, batch_rows=r)).total
                   for r in (1, 2, 4)]
        for series in (by_length, by_ttt, by_rows):
            assert all(a < b for a, b in pairwise(series))
        p = memory.predict(cfg, StepShape(8192, 5))
        assert p.total == max(p.forward_backward, p.optimizer_step)
        assert p.reserved >= p.total and p.breakdown()["allocator_slack"] == \
            p.reserved - p.total


def test_an_unchunked_loss_holds_the_whole_positions_by_vocabulary_logits():
    """A loss chunk as long as the rows: the logits and their gradient for every
    position over the draft vocabulary at once, each positions × vocabulary × 2 bytes in
    bf16 (the tensors torch allocates for them); a longer chunk adds nothing."""
    T, V = 4096, TINY.draft_vocab_size

    def chunk(loss_chunk):
        shape = StepShape(T, 3, loss_chunk=loss_chunk)
        return memory.analytic_phases(TINY, shape)["loss_forward"]["constant"]["loss_chunk"]

    logits = torch.empty(T, V, dtype=torch.bfloat16)
    assert chunk(T) == 2 * logits.nbytes == chunk(4 * T)
    assert chunk(T // 4) * 4 == chunk(T)


def test_where_the_step_peaks():
    kimi = PRESETS["kimi-k2"]
    # Eager fp32 norms keep three fp32 row-sized gradients: long rows peak in the final
    # norm's backward.
    assert memory.predict(kimi, StepShape(65536, 1, precision="fp32")).phase == "norm_backward"
    # Checkpointed steps keep little each: the diagonal-key folds' backward, where the keys
    # and values take gradients beside the fold's stacks of them, is the peak: the
    # second-last step's, which holds the last one's gradients still to be used.
    assert memory.predict(kimi, StepShape(65536, 5, checkpoint_ttt=5)).phase == \
        "fold_backward_pending"
    # some steps kept whole: the last step's fold
    assert memory.predict(kimi, StepShape(65536, 5, checkpoint_ttt=2)).phase == \
        "fold_backward"


def test_checkpointing_the_first_steps_trades_their_share_of_the_peak():
    llama = PRESETS["llama3-8b"]
    peaks = [memory.predict(llama, StepShape(32768, 7, checkpoint_ttt=n)).total
             for n in range(8)]
    assert peaks[0] == memory.predict(llama, StepShape(32768, 7)).total
    assert all(a > b for a, b in pairwise(peaks))
    # more than the number of steps: every step
    assert memory.predict(llama, StepShape(32768, 7, checkpoint_ttt=99)).total == peaks[7]
    # what a recomputed step keeps grows with the tokens as what a whole step keeps does
    groups = [_groups(StepShape(n, 5, checkpoint_ttt=2)) for n in (256, 512)]
    assert groups[1]["per_step"] == 2 * groups[0]["per_step"] > 0
    with pytest.raises(ValueError, match="counts TTT steps"):
        StepShape(32768, 7, checkpoint_ttt=True)


def test_checkpointing_keeps_each_step_small():
    llama = PRESETS["llama3-8b"]
    plain = memory.predict(llama, StepShape(32768, 7))
    kept = memory.predict(llama, StepShape(32768, 7, checkpoint_ttt=7))
    assert kept.total < 0.5 * plain.total
    phases = memory.analytic_phases(llama, StepShape(32768, 7, checkpoint_ttt=7))
    kept = {"kept_hidden", "kept_kv", "kept_tokens_positions", "kept_loss_inputs"}
    assert set(phases["loss_forward"]["per_step"]) == kept
    # the last step is recomputed only when backward reaches its layer
    assert not any(k.startswith("recomputed") for k in phases["loss_backward"]["per_token"])
    assert set(phases["attention_backward"]["per_step"]) == kept | {
        "recomputed_diag_diagonal_weights", "freed_last_step", "kv_grads"}


def test_padded_rows_and_sharding():
    # rows that are not whole flex_attention blocks (128) are padded, and attention keeps
    # padded copies: more bytes per token than a whole-block row
    whole, padded = (_groups(StepShape(n, 3))["per_step"] / n for n in (256, 200))
    assert padded > whole

    def constant(shape):
        return memory.analytic_phases(TINY, shape)["loss_backward"]["constant"]

    one = constant(StepShape(256, 3))
    ddp = constant(StepShape(256, 3, world_size=4))
    fsdp = constant(StepShape(256, 3, world_size=4, sharding="fsdp"))
    # DDP's buckets hold a gradient of every fp32 weight; FSDP shards the weights and
    # optimizer state over the ranks and gathers every fp32 weight whole (EAGLE-3's one
    # layer is in its root group)
    assert ddp["ddp_buckets"] == one["weights"]
    assert fsdp["adamw_state"] == one["adamw_state"] // 4
    assert fsdp["weights"] == one["weights"] // 4 and "ddp_buckets" not in fsdp
    trainable = sum(p.numel() for p in Eagle3Drafter(TINY).parameters() if p.requires_grad)
    assert fsdp["fsdp_gathered"] == trainable * 4


@pytest.mark.parametrize("field,value", [("max_seq_len", 0), ("ttt_steps", -1),
                                         ("batch_rows", 1.5), ("precision", "fp8"),
                                         ("sharding", "zero3")])
def test_bad_step_shapes_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        StepShape(**{"max_seq_len": 1024, "ttt_steps": 3, field: value})


def _measured_h200() -> list[Measurement]:
    """The recorded H200 peaks of llama3-8b's trained-head steps (see
    test_memory_measured.py, which checks the fits' predictions against them)."""
    record = json.loads((RESULTS / "h200-peaks-session11.json").read_text())
    return [Measurement(p["max_seq_len"], p["ttt_steps"], round(p["peak_gib"] * GiB),
                        round(p["reserved_gib"] * GiB))
            for p in record["points"]
            if p["preset"] == "llama3-8b" and not p["freeze_lm_head"]
            and p["checkpoint_ttt"] == 0]


def test_one_measured_point_is_matched_and_moves_every_scale_the_same_way():
    """One point cannot separate the groups: it is matched, and every scale moves the
    way its error asks (here up: the model is below the card), the rest left to the
    analytic prior."""
    cfg = PRESETS["llama3-8b"]
    one = min(_measured_h200(), key=lambda m: m.max_seq_len)
    assert memory.predict(cfg, StepShape(one.max_seq_len, one.ttt_steps)).total \
        < one.peak_bytes
    cal = memory.calibrate(cfg, [one])
    assert memory.predict(cfg, StepShape(one.max_seq_len, one.ttt_steps),
                          cal).forward_backward == pytest.approx(one.peak_bytes, rel=1e-3)
    assert all(s >= 1 for s in cal.scales.values())
    assert max(cal.scales.values()) < 1.05


def test_the_calibrations_least_squares_agree_with_torchs():
    """The plain-Python solver (the dashboard has no torch) against torch.linalg.lstsq, on
    systems shaped as a calibration's: a few measurements and a prior row per scale."""
    from training.drafters.eagle3.memory.calibrate import _least_squares

    g = torch.Generator().manual_seed(0)
    for rows, unknowns, spread in ((1, 4, 1.0), (6, 4, 1.0), (8, 3, 1e3), (6, 4, 1e-3)):
        A = torch.cat([torch.rand(rows, unknowns, generator=g, dtype=torch.float64)
                       * spread ** torch.linspace(0, 1, unknowns, dtype=torch.float64),
                       0.03 * torch.eye(unknowns, dtype=torch.float64)])
        b = torch.rand(rows + unknowns, generator=g, dtype=torch.float64)
        expected = torch.linalg.lstsq(A, b[:, None]).solution[:, 0]
        assert _least_squares(A.tolist(), b.tolist()) == pytest.approx(expected.tolist(),
                                                                        rel=1e-9, abs=1e-12)


def test_a_scale_that_would_go_negative_keeps_its_analytic_value():
    """Peaks that fall as a group's bytes grow would fit a negative scale, which no
    trainer has: that group keeps its analytic 1 and the others are refitted (groups of
    hand-made bytes, not the model's: the solver's guard alone)."""
    from training.drafters.eagle3.memory.calibrate import _fit_scales, _least_squares

    X = [[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]]  # [constant-like, growing] bytes per point
    y = [3.0, 2.9, 2.8]
    unguarded = torch.linalg.lstsq(torch.tensor(X, dtype=torch.float64),
                                   torch.tensor(y, dtype=torch.float64)[:, None]).solution
    assert unguarded[1, 0] < 0
    scales = _fit_scales(X, y)
    assert scales[1] == 1.0
    # the other scale is the prior-weighted fit with the growing group held at 1
    rows = [[1 / peak] for peak in y] + [[0.03]]
    rhs = [1 - x[1] / peak for x, peak in zip(X, y)] + [0.03]
    assert scales[0] == pytest.approx(_least_squares(rows, rhs)[0]) and scales[0] > 0


def test_calibration_rejects_nonsense():
    with pytest.raises(ValueError, match="at least one"):
        memory.calibrate(TINY, [])
    with pytest.raises(ValueError, match="do not fit"):  # memory falling as tokens grow
        memory.calibrate(PRESETS["llama3-8b"], [Measurement(4096, 1, 40 * GiB),
                                                Measurement(8192, 1, 20 * GiB),
                                                Measurement(4096, 3, 45 * GiB),
                                                Measurement(4096, 5, 50 * GiB)])


def test_calibration_json_round_trip(tmp_path):
    cal = memory.calibrate(PRESETS["llama3-8b"], _measured_h200())
    cal.save(tmp_path / "cal.json")
    again = Calibration.load(tmp_path / "cal.json")
    assert again == cal
    (tmp_path / "bad.json").write_text('{"scales": {"constant": 1}}')
    with pytest.raises(ValueError, match="scales"):
        Calibration.load(tmp_path / "bad.json")
    (tmp_path / "junk.json").write_text("not json")
    with pytest.raises(ValueError, match="not a calibration"):
        Calibration.load(tmp_path / "junk.json")


@pytest.mark.parametrize("name,ttt", [("kimi-k2", 5), ("llama3-8b", 3), ("tiny", 7)])
def test_largest_fitting_is_the_boundary(name, ttt):
    cfg = PRESETS[name]
    n = memory.largest_fitting(cfg, ttt, 96, multiple=2048)
    assert n > 0 and n % 2048 == 0

    def fits(length):
        return memory.fits(memory.predict(cfg, StepShape(length, ttt)), 96)

    assert fits(n) and not fits(n + 2048)


def test_largest_fitting_none_and_bad_values():
    assert memory.largest_fitting(PRESETS["kimi-k2"], 5, 8) == 0  # weights alone exceed 8 GiB
    with pytest.raises(ValueError, match="multiple"):
        memory.largest_fitting(TINY, 3, 96, multiple=0)
    with pytest.raises(ValueError, match="gpu_mem_gib"):
        memory.largest_fitting(TINY, 3, -1)


def test_the_story_predicted_uncalibrated():
    # The operator's trainer on a 96 GB card: 16384 fit, 24576 and 32768 OOM'd. trackside's
    # keeps less per token and step; with --checkpoint-ttt 64K fits, as it did on an H200
    # (bench/results/h200-flex-ttt-kimi64k.json).
    kimi = PRESETS["kimi-k2"]
    assert 25 * GiB < memory.predict(kimi, StepShape(8192, 3)).total < 40 * GiB
    assert memory.largest_fitting(kimi, 5, 96) > 24576
    assert memory.largest_fitting(kimi, 5, 96, shape=StepShape(1, 1, checkpoint_ttt=5)) >= 65536


def _write_run(path, *, device="cuda", peaks=(30.0, 31.5, 31.25)):
    cfg = PRESETS["llama3-8b"]
    config = {"model": cfg.to_dict(), "max_seq_len": 16384, "ttt_steps": 5, "batch_rows": 1,
              "loss_chunk": 2048, "precision": "bf16", "sharding": "ddp", "device": device}
    lines = [json.dumps({"event": "start", "time": 0, "config": config,
                         "steps_per_epoch": 10, "world_size": 1})]
    lines += [json.dumps({"event": "step", "step": i + 1, "peak_mem_gib": p})
              for i, p in enumerate(peaks)]
    lines.append('{"event": "step", "step": 4, "peak_mem')  # cut by a crash
    path.mkdir(parents=True, exist_ok=True)
    (path / "metrics.jsonl").write_text("\n".join(lines))


def test_measurements_from_a_run(tmp_path):
    _write_run(tmp_path / "run")
    cfg, shape, m = memory.measurements_from_run(tmp_path / "run")
    assert cfg == PRESETS["llama3-8b"]
    assert (shape.max_seq_len, shape.ttt_steps, shape.precision) == (16384, 5, "bf16")
    assert m == Measurement(16384, 5, round(31.5 * GiB))


def test_measurements_from_bad_runs(tmp_path):
    with pytest.raises(ValueError, match="metrics.jsonl"):
        memory.measurements_from_run(tmp_path)
    _write_run(tmp_path / "cpu", device="cpu")
    with pytest.raises(ValueError, match="resident set"):
        memory.measurements_from_run(tmp_path / "cpu")
    _write_run(tmp_path / "nopeak", peaks=())
    with pytest.raises(ValueError, match="peak_mem_gib"):
        memory.measurements_from_run(tmp_path / "nopeak")


class _ModuleSavedBytes:
    """Bytes autograd saves inside each watched module's forward, summed over calls."""

    def __init__(self, modules: dict, parameters):
        self.parameters = list(parameters)
        self.bytes = dict.fromkeys(modules, 0)
        self._active = []
        for name, module in modules.items():
            module.register_forward_pre_hook(lambda m, a, name=name: self._enter(name))
            module.register_forward_hook(lambda m, a, o, name=name: self._exit())

    def _enter(self, name):
        ctx = count_saved_bytes(exclude=self.parameters)
        self._active.append((name, ctx, ctx.__enter__()))

    def _exit(self):
        name, ctx, saved = self._active.pop()
        ctx.__exit__(None, None, None)
        self.bytes[name] += saved.nbytes


def test_cpu_saved_bytes_of_the_layer_match_the_analytic_terms(monkeypatch):
    """Real torch on CPU (fp32, no autocast): what the norms and the MLP keep for backward,
    counted with saved-tensor hooks, equals the per-token-per-step terms exactly."""
    torch.manual_seed(0)
    model = Eagle3Drafter(TINY)
    layer = model.midlayer
    watch = _ModuleSavedBytes({"post_attention_layernorm": layer.post_attention_layernorm,
                               "mlp": layer.mlp, "o_proj": layer.self_attn.o_proj,
                               "q_proj": layer.self_attn.q_proj},
                              model.parameters())
    # the embedding's and the hidden state's norms run as one function, not as modules
    input_norms = []
    side_by_side_norms = model_module.side_by_side_norms

    def counted(*args):
        with count_saved_bytes(exclude=model.parameters()) as saved:
            out = side_by_side_norms(*args)
        input_norms.append(saved.nbytes)
        return out
    monkeypatch.setattr(model_module, "side_by_side_norms", counted)
    L, K = 256, 3
    batch = random_batch(TINY, L, 2, torch.device("cpu"), torch.float32, sample_len=64)
    model.step_losses(batch, K, loss_chunk=128)
    T = 2 * L
    terms = memory.saved_per_token_step(TINY, "fp32")
    H = TINY.hidden_size
    assert sum(input_norms) == (terms["embed_norm"] + terms["hidden_norm"]) * T * K
    # post_attn_norm's term also counts its output, which the MLP's gate and up keep
    assert watch.bytes["post_attention_layernorm"] == (terms["post_attn_norm"] - H * 4) * T * K
    assert watch.bytes["mlp"] == (terms["mlp"] + H * 4) * T * K
    assert watch.bytes["o_proj"] == terms["o_proj_input"] * T * K
    assert watch.bytes["q_proj"] == terms["qkv_inputs"] * T * K  # k and v keep the same one


@pytest.mark.parametrize("L,K,rows", [(128, 1, 8), (128, 3, 8), (256, 5, 4), (128, 7, 8)])
def test_cpu_saved_bytes_of_a_whole_unroll_within_10_percent(L, K, rows):
    """Everything autograd keeps over a whole TTT unroll of the tiny drafter on CPU (fp32,
    saved-tensor hooks, parameters left out) against the analytic activation terms.

    The CPU runs the dense attention, not flex_attention, so the check swaps the flex and
    diagonal-key terms for what the dense path keeps at step k: q, the fp32 probabilities
    [heads, L, (k+1)L], the keys and values of steps 0..k concatenated (k > 0), and once
    per batch the mask [L, (k+1)L] of each row. Stated bound: within 10 %.
    """
    trainer = Trainer(TINY, torch.device("cpu"))
    batch = random_batch(TINY, L, rows, torch.device("cpu"), torch.float32, sample_len=64)
    with count_saved_bytes(exclude=state_tensors(trainer)) as saved:
        trainer.drafter.step_losses(batch, K, loss_chunk=128)
    # activations and the batch are the same in every phase
    terms = memory.analytic_phases(TINY, StepShape(L, K, rows, 128, "fp32"))["loss_forward"]
    T, nh, D, H = rows * L, TINY.num_heads, TINY.head_dim, TINY.hidden_size
    kv = TINY.num_kv_heads * D
    kept = (sum(terms["per_step"].values()) + terms["per_token"]["doc_ids_copy"]
            + 3 * H * 4 * T)  # fc keeps the batch's aux hidden states
    dense = sum(rows * (nh * L * S * L * 4 + L * S * L + nh * D * 4 * L
                        + (2 * S * L * kv * 4 if S > 1 else 0)) for S in range(1, K + 1))
    predicted = kept - terms["per_step"]["step_flex_attention"] + dense
    assert 0.9 < predicted / saved.nbytes < 1.1


