"""Relaunch parameters: typed, range-checked, and only plain numbers reach an argv."""

from __future__ import annotations

import pytest

from backends.params import PARAMS, ParamError, apply, check, parse_sets, read, set_flag
from training.contract import UsageError


def test_parse_sets_types_values():
    assert parse_sets(["max_seq_len=16384", "ttt_steps=5", "ttt_decay=1", "lr=3e-4"]) == {
        "max_seq_len": 16384,
        "ttt_steps": 5,
        "ttt_decay": 1.0,
        "lr": 3e-4,
    }
    assert isinstance(parse_sets(["ttt_decay=1"])["ttt_decay"], float)


@pytest.mark.parametrize(
    "item, key",
    [
        ("max_seq_len=8192; touch /tmp/pwned", "max_seq_len"),
        ("max_seq_len=$(id)", "max_seq_len"),
        ("max_seq_len=`id`", "max_seq_len"),
        ("max_seq_len=8192\n", "max_seq_len"),
        ("max_seq_len= 8192", "max_seq_len"),
        ("max_seq_len='8192'", "max_seq_len"),
        ('max_seq_len="8192"', "max_seq_len"),
        ("max_seq_len=8_192", "max_seq_len"),
        ("max_seq_len=8192.0", "max_seq_len"),
        ("max_seq_len=64", "max_seq_len"),  # below 128
        ("max_seq_len=2097152", "max_seq_len"),  # above 1M
        ("ttt_steps=0", "ttt_steps"),
        ("ttt_steps=17", "ttt_steps"),
        ("ttt_decay=0", "ttt_decay"),  # (0, 1]: zero is out
        ("ttt_decay=1.5", "ttt_decay"),
        ("lr=0", "lr"),
        ("lr=-1e-4", "lr"),
        ("lr=nan", "lr"),
        ("lr=inf", "lr"),
        ("steps=0", "steps"),
        ("batch_rows=", "batch_rows"),
        ("colour=red", "colour"),
        ("max_seq_len", "max_seq_len"),
        ("$(id)=1", "$(id)"),
    ],
)
def test_parse_sets_rejects_naming_the_key(item, key):
    with pytest.raises(ParamError) as err:
        parse_sets([item])
    assert err.value.key == key and str(err.value).startswith(f"{key}:")


@pytest.mark.parametrize("item, message", [
    ("batch_rows=-5", "batch_rows: must be ≥ 1 (got -5)"),
    ("max_seq_len=2097152", "max_seq_len: must be ≤ 1,048,576 (got 2,097,152)"),
    ("ttt_decay=0", "ttt_decay: must be > 0 (got 0)"),
    ("lr=-1e-4", "lr: must be > 0 (got -0.0001)"),
    ("max_seq_len=8_192", "max_seq_len: '8_192' is not a whole number in digits"),
    ("lr=1e4e", "lr: '1e4e' is not a number in digits (e.g. 3e-4)"),
])
def test_a_rejected_value_is_told_what_is_wrong(item, message):
    with pytest.raises(ParamError) as err:
        parse_sets([item])
    assert str(err.value) == message


def test_ranges_read_as_integers_where_the_param_is_one():
    assert PARAMS["max_seq_len"].describe() == "int ≥ 128 and ≤ 1,048,576"
    assert PARAMS["ttt_decay"].describe() == "float > 0 and ≤ 1"
    assert PARAMS["checkpoint_ttt"].describe() == "int ≥ 0 and ≤ 16: TTT steps recomputed"


def test_check_validates_typed_values():
    assert check({"ttt_steps": 4.0, "lr": 1}) == {"ttt_steps": 4, "lr": 1.0}
    for bad in [{"ttt_steps": 4.5}, {"ttt_steps": True}, {"lr": "1e-4"}, {"lr": float("nan")}, {"nope": 1}]:
        with pytest.raises(ParamError):
            check(bad)


def test_apply_replaces_or_adds_flags_in_both_forms():
    argv = ["trackside", "train", "--synthetic", "--max-seq-len", "8192", "--lr=1e-4"]
    assert apply(argv, {"max_seq_len": 16384, "lr": 3e-4, "ttt_steps": 5}) == [
        "trackside", "train", "--synthetic", "--max-seq-len", "16384", "--lr=0.0003", "--ttt-steps", "5",
    ]  # fmt: skip
    assert read(apply(argv, {"ttt_decay": 0.5})) == {"max_seq_len": 8192, "lr": 1e-4, "ttt_decay": 0.5}


def test_read_rejects_malformed_values_in_an_argv():
    with pytest.raises(ParamError, match="ttt_steps"):
        read(["trackside", "train", "--ttt-steps", "$(id)"])
    with pytest.raises(ParamError, match="has no value"):
        read(["trackside", "train", "--ttt-steps"])


def test_set_flag_keeps_other_arguments_literal():
    argv = ["x", "--note", "--out", "a; rm -rf /"]
    assert set_flag(argv, "--out", "/runs/r1") == ["x", "--note", "--out", "/runs/r1"]
    assert set_flag(["x"], "--out", "/runs/r1") == ["x", "--out", "/runs/r1"]


def test_a_bool_param_is_a_bare_flag_added_or_removed():
    argv = ["python", "-m", "training", "train", "--max-seq-len", "8192"]
    assert read(argv) == {"max_seq_len": 8192}
    on = apply(argv, {"freeze_lm_head": True})
    assert on == argv + ["--freeze-lm-head"]
    assert read(on) == {"max_seq_len": 8192, "freeze_lm_head": True}
    assert apply(on, {"freeze_lm_head": True}) == on  # not added twice
    assert apply(on + ["--freeze-lm-head"], {"freeze_lm_head": False}) == argv
    assert parse_sets(["freeze_lm_head=true", "ttt_steps=7"]) == {"freeze_lm_head": True, "ttt_steps": 7}
    assert parse_sets(["freeze_lm_head=TRUE"]) == parse_sets(["freeze_lm_head=True"]) == {"freeze_lm_head": True}
    for bad in ("freeze_lm_head=1", "freeze_lm_head=yes"):
        with pytest.raises(ParamError, match="freeze_lm_head"):
            parse_sets([bad])
    with pytest.raises(ParamError, match="freeze_lm_head"):
        check({"freeze_lm_head": 1})
    with pytest.raises(ParamError, match="takes no value"):
        read(argv + ["--freeze-lm-head=1"])


def test_checkpoint_ttt_counts_steps_and_may_be_given_bare():
    argv = ["python", "-m", "training", "train", "--max-seq-len", "8192"]
    # bare (as runs before partial checkpointing were launched): every step
    bare = argv[:4] + ["--checkpoint-ttt"] + argv[4:]
    assert read(bare) == {"max_seq_len": 8192, "checkpoint_ttt": 16}
    assert read(argv + ["--checkpoint-ttt"]) == {"max_seq_len": 8192, "checkpoint_ttt": 16}
    two = apply(bare, {"checkpoint_ttt": 2})
    assert two == argv + ["--checkpoint-ttt", "2"]  # the flag after it kept its value
    assert read(two) == {"max_seq_len": 8192, "checkpoint_ttt": 2}
    assert apply(two, {"checkpoint_ttt": 0}) == argv
    assert apply(argv + ["--checkpoint-ttt=3"], {"checkpoint_ttt": 0}) == argv
    assert parse_sets(["checkpoint_ttt=3"]) == {"checkpoint_ttt": 3}
    for bad in ("checkpoint_ttt=true", "checkpoint_ttt=-1", "checkpoint_ttt=17"):
        with pytest.raises(ParamError, match="checkpoint_ttt"):
            parse_sets([bad])
    # a run launched while the flag was a bool recorded true/false in its manifest
    assert check({"checkpoint_ttt": True, "ttt_steps": 5}) == {"checkpoint_ttt": 16, "ttt_steps": 5}
    assert apply(argv, {"checkpoint_ttt": True}) == argv + ["--checkpoint-ttt", "16"]
    assert apply(bare, {"checkpoint_ttt": False}) == argv


def test_every_param_is_a_flag_of_the_trainer_with_its_kind():
    # The trainer's parser is the other side of the argv contract: a param it lacks would
    # relaunch into a usage error.
    from training.cli import train_parser

    actions = {a.dest: a for a in train_parser()._actions}
    for name, param in PARAMS.items():
        assert name in actions, name
        assert param.flag in actions[name].option_strings
        assert (actions[name].nargs == 0) == (param.kind is bool), name


def _edges(param) -> list[tuple[str, bool]]:
    """Values at and just past each end of a param's range, each with whether it is in."""
    step = 1 if param.kind is int else 0.5
    shown = (lambda v: str(int(v))) if param.kind is int else repr
    edges = []
    if param.low is not None:
        edges += [(param.low, not param.low_open), (param.low - step, False)]
        if param.low_open:
            edges.append((param.low + step, True))
    if param.high is not None:
        edges += [(param.high, True), (param.high + step, False)]
    return [(shown(value), inside) for value, inside in edges]


@pytest.mark.parametrize("name", [name for name, param in PARAMS.items() if param.kind is not bool])
def test_the_trainer_takes_exactly_the_range_an_edit_may_set(name, capsys):
    # An edit accepted by relaunch --set or the edit form is never refused by the trainer it
    # relaunches, and the trainer takes nothing an edit could not set.
    from training.cli import train_parser

    param = PARAMS[name]
    for text, inside in _edges(param):
        try:
            parsed, said = getattr(train_parser().parse_args(["--synthetic", param.flag, text]), name), ""
        except UsageError as refused:
            parsed, said = None, str(refused)
        assert (parsed is not None) == inside, (param.flag, text, said)
        if inside:
            assert parsed == parse_sets([f"{name}={text}"])[name]
        else:
            assert said.startswith(param.flag)
            with pytest.raises(ParamError):
                parse_sets([f"{name}={text}"])


def test_a_bare_checkpoint_ttt_is_every_step_to_both():
    from training.cli import train_parser

    bare = train_parser().parse_args(["--synthetic", "--checkpoint-ttt"]).checkpoint_ttt
    assert bare == read(["--checkpoint-ttt"])["checkpoint_ttt"] == PARAMS["ttt_steps"].high


@pytest.mark.parametrize("item, message", [
    ("block_size=0", "block_size: must be ≥ 2 (got 0)"),
    ("block_size=1", "block_size: must be ≥ 2 (got 1)"),
    ("max_anchors=0", "max_anchors: must be ≥ 1 (got 0)"),
    ("soft_kl=1.5", "soft_kl: must be ≤ 1 (got 1.5)"),
    ("soft_kl=-0.1", "soft_kl: must be ≥ 0 (got -0.1)"),
    ("dflash_gamma=0", "dflash_gamma: must be > 0 (got 0)"),
    ("num_layers=0", "num_layers: must be ≥ 1 (got 0)"),
])
def test_dflash_params_are_checked_as_its_trainer_checks_them(item, message):
    with pytest.raises(ParamError) as err:
        parse_sets([item])
    assert str(err.value) == message


def test_dflash_params_accept_what_its_trainer_accepts():
    import argparse

    from training.cli import train_parser

    types = {a.dest: a.type for a in train_parser()._actions}
    for key, good, bad in [("soft_kl", ["0", "1", "0.15"], ["1.5", "-0.1"]),
                           ("dflash_gamma", ["0.5", "7"], ["0", "-1"]),
                           ("max_anchors", ["1", "1024"], ["0"])]:
        for text in good:
            assert parse_sets([f"{key}={text}"])[key] == types[key](text)
        for text in bad:
            with pytest.raises(argparse.ArgumentTypeError):
                types[key](text)
            with pytest.raises(ParamError):
                parse_sets([f"{key}={text}"])


def test_a_dflash_argv_carries_its_params_through_a_relaunch():
    argv = ["python", "-m", "training", "train", "--drafter", "dflash", "--synthetic", "--max-anchors", "64"]
    assert read(argv) == {"max_anchors": 64}
    edited = apply(argv, {"max_anchors": 32, "block_size": 8, "soft_kl": 0.15, "dflash_gamma": 4.0})
    assert edited == argv[:-1] + ["32", "--block-size", "8", "--soft-kl", "0.15", "--dflash-gamma", "4.0"]
    assert read(edited) == {"max_anchors": 32, "block_size": 8, "soft_kl": 0.15, "dflash_gamma": 4.0}


def test_conflicts_name_a_block_or_anchors_a_row_cannot_hold():
    from backends.params import conflicts

    assert conflicts({"max_seq_len": 512, "block_size": 16, "max_anchors": 497}, "dflash") == []
    assert conflicts({"block_size": 16, "max_anchors": 4096}, "dflash") == []  # the row's length unknown
    assert [str(e) for e in conflicts({"max_seq_len": 512, "block_size": 1024, "max_anchors": 4096}, "dflash")] == [
        "block_size: must be ≤ max_seq_len 512 (got 1,024)"]  # fmt: skip
    assert [str(e) for e in conflicts({"max_seq_len": 512, "block_size": 16, "max_anchors": 498}, "dflash")] == [
        "max_anchors: must be ≤ 497, the blocks of 16 a row of max_seq_len 512 holds (got 498)"]  # fmt: skip
    assert [e.key for e in conflicts({"max_seq_len": 512, "max_anchors": 513})] == ["max_anchors"]


@pytest.mark.parametrize("params, drafter, said", [
    ({"steps": 100, "epochs": 2}, "eagle3", "epochs: not with steps"),
    ({"block_size": 16}, "eagle3", "block_size: DFlash's; this run trains EAGLE-3"),
    ({"ttt_steps": 5}, "dflash", "ttt_steps: EAGLE-3's; this run trains DFlash"),
    ({"checkpoint_ttt": 5, "ttt_steps": 3}, "eagle3", "checkpoint_ttt: must be ≤ ttt_steps 3"),
])
def test_edits_the_trainer_would_refuse_are_refused(params, drafter, said):
    from backends.params import conflicts

    assert [str(e) for e in conflicts(params, drafter)][0].startswith(said)


def test_edits_the_trainer_takes_are_not_refused():
    from backends.params import conflicts

    assert conflicts({"steps": 100, "epochs": None}, "eagle3") == []  # epochs cleared, steps set
    assert conflicts({"checkpoint_ttt": 16, "ttt_steps": 3}, "eagle3") == []  # bare: every step
    assert conflicts({"max_anchors": 64, "ttt_steps": None}, "dflash") == []


def test_a_cleared_parameter_leaves_the_argv():
    from backends.params import edited

    argv = ["python", "-m", "training", "train", "--synthetic", "--steps", "100", "--lr", "0.001"]
    new, params = edited(argv, {"steps": 100, "lr": 0.001}, {"steps": None, "epochs": 2})
    assert new == ["python", "-m", "training", "train", "--synthetic", "--lr", "0.001", "--epochs", "2"]
    assert params == {"lr": 0.001, "epochs": 2}
    with pytest.raises(ParamError, match="epochs: not with steps"):
        edited(argv, {"steps": 100}, {"epochs": 2})
    with pytest.raises(ParamError, match="lr: must be ≤ 1"):
        parse_sets(["lr=1e9"])
