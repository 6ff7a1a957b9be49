"""The memory model: analytic terms by hand, calibration, largest fitting, run metrics."""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

from training import memory
from training import model as model_module
from training.config import PRESETS
from training.probe import Trainer, count_saved_bytes, random_batch, state_tensors
from training.memory import GiB, Calibration, Measurement, StepShape
from training.model import Eagle3Drafter

TINY = PRESETS["tiny"]  # H 64, 4 heads of 16, 2 KV heads, MLP 192, vocab 512, draft 256


def test_tiny_parameter_counts_by_hand_and_against_the_model():
    counts = memory.parameter_counts(TINY)
    fc = 3 * 64 * 64  # 12288
    qkv = 2 * 64 * (4 * 16 + 2 * 2 * 16)  # [emb ; hidden] → q 64, k 32, v 32: 16384
    o = 64 * 64  # 4096
    mlp = 3 * 64 * 192  # 36864
    norms = 4 * 64  # 256
    lm_head = 256 * 64  # 16384
    assert counts["trainable"] == fc + qkv + o + mlp + norms + lm_head == 86272
    assert counts["autocast_cached"] == fc + qkv + o + mlp == 69632
    assert counts["frozen"] == 512 * 64 + 256 * 64 == 49152

    model = Eagle3Drafter(TINY)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    frozen = model.embed_tokens.weight.numel() + model.target_head.numel()
    assert (trainable, frozen) == (counts["trainable"], counts["frozen"])

    # --freeze-lm-head: the draft head leaves the trained ones and is the target head
    model.freeze_lm_head()
    held = memory.parameter_counts(TINY, freeze_lm_head=True)
    assert held["trainable"] == sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert (held["trainable"], held["frozen"]) == (86272 - lm_head, 49152)
    assert model.lm_head.weight.data_ptr() == model.target_head.data_ptr()


def test_a_frozen_head_takes_no_gradient_memory_and_no_cast_under_bf16():
    plain = memory.analytic_phases(TINY, StepShape(256, 3))
    frozen = memory.analytic_phases(TINY, StepShape(256, 3, freeze_lm_head=True))
    head_only = {"lm_head_step_grads", "lm_head_grad", "loss_head_casts"}
    for phase in memory.PHASES:
        names = set(frozen[phase]["constant"])
        assert not names & head_only, phase
        assert names | head_only >= set(plain[phase]["constant"])
    # in fp32 the bf16 head is cast for the loss, as a trained fp32 head is not
    fp32 = memory.analytic_phases(TINY, StepShape(256, 3, precision="fp32",
                                                  freeze_lm_head=True))
    assert fp32["loss_forward"]["constant"]["loss_head_casts"] == 256 * 64 * 4


def test_tiny_analytic_terms_by_hand():
    # T = 2 rows × 256 = 512 tokens, K = 3, bf16 activations (a = 2 bytes), chunk 128.
    shape = StepShape(max_seq_len=256, ttt_steps=3, batch_rows=2, loss_chunk=128,
                      precision="bf16")
    phases = memory.analytic_phases(TINY, shape)
    assert tuple(phases) == memory.PHASES
    T, TK, TK1, pairs = 512, 512 * 3, 512 * 2, 512 * 3  # pairs: T·K(K-1)/2 = 512·3
    state = {
        "weights": 86272 * 4,  # 345088
        "frozen": 49152 * 2 + 256 * 8 + 512,  # bf16 embedding + head, d2t int64, t2d bool
        "adamw_state": 2 * 86272 * 4,
        "autocast_weights": 69632 * 2,
    }
    casts = 256 * 64 * 2  # the draft head in bf16 (the verifier's is cast once, earlier)
    head = 256 * 64 * 4  # a draft-head gradient, fp32
    assert phases["loss_forward"]["constant"] == {
        **state, "loss_head_casts": casts, "lm_head_step_grads": 3 * head,
        "loss_chunk": 2 * 128 * 256 * 2}  # logits, gradient: bf16 (probabilities read in place)
    # backward scales the kept gradients: the head's becomes lm_head's .grad
    assert phases["loss_backward"]["constant"] == {
        **state, "lm_head_step_grads": 3 * head, "lm_head_grad": head}
    assert phases["norm_backward"]["constant"] == {
        **state, "lm_head_step_grads": 2 * head, "lm_head_grad": head}
    batch = {"batch": (4 * 64 * 2 + 3 * 8 + 1) * T,  # aux 3H + final H in bf16; 3 int64; mask
             "doc_ids_copy": 8 * T,
             "verifier_targets": (256 * 2 + 8) * T}  # bf16 probabilities, int64 argmax
    assert phases["loss_forward"]["per_token"] == batch
    assert phases["loss_backward"]["per_token"] == {**batch, "loss_input_grad": 64 * 2 * T}
    # compiled, the norm's gradient takes the place of its freed input
    assert phases["norm_backward"]["per_token"] == {**batch, "loss_input_grad": 64 * 2 * T}
    norm = 64 * 2 + 4  # compiled: the bf16 input and 1/rms: 132
    per_step = {
        "step_embed_norm": norm * TK,  # the embedding cast to bf16, and 1/rms
        "step_hidden_norm": norm * TK,
        "step_qkv_inputs": (2 * 64) * 2 * TK,  # one bf16 [emb ; hidden] for q, k and v
        "step_rope_cos_sin": 2 * 8 * 4 * TK,  # cos, sin (shared by q and k) × D/2 fp32
        "step_kv": 2 * 32 * 2 * TK,
        "step_flex_attention": (2 * 64 * 2 + 4 * 4) * TK,  # q, out; lse (fp32, per head)
        "step_o_proj_input": 64 * 2 * TK,
        "step_post_attn_norm": (norm + 64 * 2) * TK,
        "step_mlp": 2 * 192 * 2 * TK,  # gate, up
        "step_loss_inputs": (norm + 64 * 2 + 24 + 4 + 1) * TK,  # + grad, index, loss, agree
        # steps 1, 2 fold their diagonal keys into flex's output: its softmax weight
        "later_step_fold_out_weight": 4 * 4 * TK1,  # fp32, per query head
    }
    diagonal = {"diagonal_weights": 4 * 4 * pairs}  # fp32, per query head
    for name in memory.PHASES[:-1]:
        assert phases[name]["per_step"] == per_step and phases[name]["diagonal"] == diagonal
    attention = phases["attention_backward"]
    freed = per_step["step_mlp"] + per_step["step_post_attn_norm"] \
        + per_step["step_loss_inputs"] + per_step["step_o_proj_input"]
    assert attention["per_step"] == {**per_step, "freed_last_step": -freed // 3,
                                     "kv_grads": 2 * 32 * 2 * TK}
    assert attention["per_token"] == {**batch, "attention_input_grads": (64 + 64 + 64) * 2 * T}
    p = memory.predict(TINY, shape)
    totals = {name: sum(v for g in t.values() for v in g.values()) for name, t in phases.items()}
    # At 128-position chunks of a 64-wide drafter the loss's forward chunks are the peak.
    assert p.phase == "loss_forward" == max(totals, key=totals.get)
    assert p.forward_backward == totals["loss_forward"] and p.terms == phases["loss_forward"]
    # fused AdamW in place: weights, grads, 2 states; plus frozen and the batch
    assert p.optimizer_step == 4 * 86272 * 4 + state["frozen"] + batch["batch"]
    assert p.total == max(p.forward_backward, p.optimizer_step)
    assert p.reserved == max(math.ceil(p.total * memory.RESERVED_RATIO),
                             p.total + p.row_slack)
    assert p.breakdown()["allocator_slack"] == p.reserved - p.total > 0


def test_where_the_step_peaks():
    kimi = PRESETS["kimi-k2"]
    # Eager fp32 norms keep three fp32 row-sized gradients: long rows peak in the final
    # norm's backward.
    assert memory.predict(kimi, StepShape(65536, 1, precision="fp32")).phase == "norm_backward"
    # Checkpointed steps keep little each: the last step's attention backward, where every
    # step's keys and values take gradients, is the peak.
    assert memory.predict(kimi, StepShape(65536, 5, checkpoint_ttt=5)).phase == \
        "attention_backward"


def test_checkpointing_the_first_steps_trades_their_share_of_the_peak():
    llama = PRESETS["llama3-8b"]
    peaks = [memory.predict(llama, StepShape(32768, 7, checkpoint_ttt=n)).total
             for n in range(8)]
    assert peaks[0] == memory.predict(llama, StepShape(32768, 7)).total
    assert all(a > b for a, b in zip(peaks, peaks[1:]))
    # more than the number of steps: every step
    assert memory.predict(llama, StepShape(32768, 7, checkpoint_ttt=99)).total == peaks[7]
    # two of seven: those two keep their inputs and outputs, the other five everything,
    # and only those five keep concatenated keys (Σ k for k = 2..6 diagonal segments)
    T = 32768
    phases = memory.analytic_phases(llama, StepShape(T, 7, checkpoint_ttt=2))["loss_forward"]
    step = memory.saved_per_token_step(llama, "bf16")
    kept = memory.kept_per_token_checkpointed_step(llama, "bf16")
    assert phases["per_step"]["step_mlp"] == step["mlp"] * T * 5
    assert phases["per_step"]["kept_hidden"] == kept["hidden"] * T * 2
    diag = memory.saved_per_token_diag(llama, "bf16")["diagonal_weights"]
    assert phases["diagonal"]["diagonal_weights"] == diag * T * (2 + 3 + 4 + 5 + 6)
    with pytest.raises(ValueError, match="counts TTT steps"):
        StepShape(T, 7, checkpoint_ttt=True)


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
    def terms(shape, group):
        return memory.analytic_phases(TINY, shape)["loss_backward"][group]

    whole = terms(StepShape(256, 3), "per_step")
    padded = terms(StepShape(200, 3), "per_step")
    # 200 tokens are padded to 256 for flex_attention, which then keeps copies of k, v
    assert padded["step_flex_attention"] == (2 * 64 * 2 + 2 * 32 * 2 + 4 * 4) * 200 * 3
    assert whole["step_flex_attention"] == (2 * 64 * 2 + 4 * 4) * 256 * 3
    one = terms(StepShape(256, 3), "constant")
    ddp = terms(StepShape(256, 3, world_size=4), "constant")
    fsdp = terms(StepShape(256, 3, world_size=4, sharding="fsdp"), "constant")
    assert ddp["ddp_buckets"] == one["weights"]
    assert fsdp["adamw_state"] == one["adamw_state"] // 4
    assert fsdp["fsdp_gathered"] == 86272 * 2


@pytest.mark.parametrize("field,value", [("max_seq_len", 0), ("ttt_steps", -1),
                                         ("batch_rows", 1.5), ("precision", "fp8"),
                                         ("sharding", "zero3")])
def test_bad_step_shapes_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        StepShape(**{"max_seq_len": 1024, "ttt_steps": 3, field: value})


def _synthetic(cfg, truth: dict, points, **shape):
    """Peaks a drafter with the given true group scales would measure."""
    out = []
    for length, k in points:
        totals = memory.group_totals(cfg, StepShape(length, k, **shape))
        peak = max(sum(t * truth[g] for t, g in zip(phase, memory.GROUPS)) for phase in totals)
        out.append(Measurement(length, k, round(peak), round(peak * 1.07)))
    return out


TRUTH = {"constant": 1.06, "per_token": 0.85, "per_step": 1.1, "diagonal": 1.2}
PROBE = [(4096, 1), (8192, 1), (4096, 3), (8192, 3), (4096, 5), (32768, 1)]


def test_calibration_recovers_known_scales_and_slopes_and_extrapolates():
    cfg = PRESETS["llama3-8b"]
    cal = memory.calibrate(cfg, _synthetic(cfg, TRUTH, PROBE))
    # The well separated groups come back; the smaller ones come back near their truth or
    # held part of the way to 1 by the analytic prior: the diagonal group (a weight per
    # head and diagonal key, 0.1 % of a step's peak) stays at its prior, and per_step,
    # which the fit cannot tell from it, takes up its share.
    assert cal.scales["constant"] == pytest.approx(1.06, abs=0.002)
    assert cal.scales["per_step"] == pytest.approx(1.1, abs=0.01)
    assert 0.84 < cal.scales["per_token"] < 1 and 1 <= cal.scales["diagonal"] < 1.2
    biggest = max(_synthetic(cfg, TRUTH, PROBE), key=lambda m: m.peak_bytes)
    assert cal.reserved_slack == biggest.reserved_bytes - biggest.peak_bytes
    # The slope in bytes: the analytic per-token-step bytes times the true scale.
    coef = cal.fitted_on["coefficients"]
    per_step = sum(memory.saved_per_token_step(cfg, "bf16").values())
    assert coef["per_token_step"] == pytest.approx(1.1 * per_step, rel=0.01)
    # Far outside the probe: 64K tokens at TTT 7, 128K at TTT 1.
    for far in ((65536, 7), (131072, 1)):
        (m,) = _synthetic(cfg, TRUTH, [far])
        assert memory.predict(cfg, StepShape(*far), cal).total == pytest.approx(
            m.peak_bytes, rel=0.01)


def test_calibration_with_noise_stays_close():
    cfg = PRESETS["kimi-k2"]
    g = torch.Generator().manual_seed(0)
    points = PROBE + [(16384, 3), (8192, 7)]  # a run's metrics added to the probe
    noisy = [dataclasses.replace(m, peak_bytes=round(m.peak_bytes * (1 + 0.01 * float(
        torch.randn(1, generator=g))))) for m in _synthetic(cfg, TRUTH, points)]
    cal = memory.calibrate(cfg, noisy)
    for far in ((32768, 5), (65536, 1)):
        (m,) = _synthetic(cfg, TRUTH, [far])
        predicted = memory.predict(cfg, StepShape(*far), cal).total
        assert abs(predicted - m.peak_bytes) / m.peak_bytes < 0.03


def test_calibration_from_too_few_points_matches_them_and_keeps_the_rest():
    cfg = PRESETS["kimi-k2"]
    (one,) = _synthetic(cfg, TRUTH, [(16384, 5)])
    cal = memory.calibrate(cfg, [one])
    assert memory.predict(cfg, StepShape(16384, 5), cal).forward_backward == pytest.approx(
        one.peak_bytes, rel=1e-3)
    # One point moves every scale the same way, in proportion to its group's share.
    assert all(s > 1 for s in cal.scales.values())
    same_k = _synthetic(cfg, TRUTH, [(4096, 3), (16384, 3)])
    cal = memory.calibrate(cfg, same_k)
    for m in same_k:
        p = memory.predict(cfg, StepShape(m.max_seq_len, 3), cal).forward_backward
        assert p == pytest.approx(m.peak_bytes, rel=1e-3)


def test_the_calibrations_least_squares_agree_with_torchs():
    """The plain-Python solver (the dashboard has no torch) against torch.linalg.lstsq, on
    systems shaped as a calibration's: a few measurements and a prior row per scale."""
    from training.memory.calibrate import _least_squares

    g = torch.Generator().manual_seed(0)
    for rows, unknowns, spread in ((1, 4, 1.0), (6, 4, 1.0), (8, 3, 1e3), (6, 4, 1e-3)):
        A = torch.cat([torch.rand(rows, unknowns, generator=g, dtype=torch.float64)
                       * spread ** torch.linspace(0, 1, unknowns, dtype=torch.float64),
                       0.03 * torch.eye(unknowns, dtype=torch.float64)])
        b = torch.rand(rows + unknowns, generator=g, dtype=torch.float64)
        expected = torch.linalg.lstsq(A, b[:, None]).solution[:, 0]
        assert _least_squares(A.tolist(), b.tolist()) == pytest.approx(expected.tolist(),
                                                                        rel=1e-9, abs=1e-12)


def test_calibration_rejects_nonsense():
    with pytest.raises(ValueError, match="at least one"):
        memory.calibrate(TINY, [])
    with pytest.raises(ValueError, match="do not fit"):  # memory falling as tokens grow
        memory.calibrate(PRESETS["llama3-8b"], [Measurement(4096, 1, 40 * GiB),
                                                Measurement(8192, 1, 20 * GiB),
                                                Measurement(4096, 3, 45 * GiB),
                                                Measurement(4096, 5, 50 * GiB)])


def test_calibration_json_round_trip(tmp_path):
    cfg = PRESETS["llama3-8b"]
    cal = memory.calibrate(cfg, _synthetic(cfg, TRUTH, PROBE))
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
    # keeps less per token and step; with --checkpoint-ttt 64K fits (the H200 trained
    # 65536 × TTT 5 in 80.86 GiB, bench/results/h200-flex-ttt-kimi64k.txt).
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


def test_a_group_that_would_go_negative_keeps_its_analytic_scale():
    cfg = PRESETS["kimi-k2"]
    truth = {**TRUTH, "per_token": -1.0}  # no real trainer has this: the fit must not follow
    cal = memory.calibrate(cfg, _synthetic(cfg, truth, PROBE))
    assert cal.scales["per_token"] == 1.0
    assert all(s > 0 for s in cal.scales.values())
    assert 0 < cal.fitted_on["max_error"] < memory.MAX_FIT_ERROR


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


RESULTS = Path(__file__).resolve().parents[2] / "bench/results"
CURRENT = [RESULTS / "h200-peaks-session11.json"]


def test_recorded_h200_peaks_of_the_current_trainer_uncalibrated():
    """Peaks of the trainer as it is now (compiled islands, verifier targets once per
    batch, the head's gradients taken in the loss's forward, flex attention over the
    step-0 keys with the diagonal keys folded in, silu(gate)·up recomputed, the verifier's
    tables in bf16, a frozen draft head the verifier's own), measured on NVIDIA H200s by
    bench/train_step.py (each point's command is in its file): the analytic model, with no
    calibration, predicts each within 8 % (seen: -1.6 % to -0.2 %; the issue asks 10 %).
    The older recorded runs above describe earlier trainers: only the calibration is
    tested on them."""
    for record in CURRENT:
        data = json.loads(record.read_text())
        for point in data["points"]:
            shape = StepShape(point["max_seq_len"], point["ttt_steps"],
                              checkpoint_ttt=point["checkpoint_ttt"],
                              freeze_lm_head=point.get("freeze_lm_head", False))
            predicted = memory.predict(PRESETS[point["preset"]], shape)
            error = predicted.total / GiB / point["peak_gib"] - 1
            assert abs(error) < 0.08, point
            # What a cap is checked against: the caching allocator's reserve at the peak
            # (RESERVED_RATIO, CACHED_ROW_BLOCKS), under the trainer's allocator; never
            # below what was held (seen +1.9 % to +4.1 %).
            if data.get("allocator") == "expandable_segments:True":
                error = predicted.reserved / GiB / point["reserved_gib"] - 1
                assert 0 <= error < 0.05, point
