"""`trackside --help` lists every subcommand, each subcommand's --help is its usage
(exit 0), and a bad argument to any of them is one line on stderr, exit 2."""

from __future__ import annotations

import re

import pytest

from tui import cli


def doubled(line: str) -> bool:
    """Whether a prefix is said twice: "trackside: trackside launch: …", "gone: gone: …"."""
    return "trackside: trackside" in line or re.search(r"(^|\s)(\S+:)\s+\2", line) is not None


def invoke(capsys, argv: list[str]) -> tuple[int, str, str]:
    try:
        code = cli.main(argv)
    except SystemExit as done:  # argparse's help ends the process
        code = done.code
    out, err = capsys.readouterr()
    return code, out, err


def test_every_routed_command_has_its_line():
    assert set(cli.SUMMARIES) == {"demo"} | cli.TRAINING_COMMANDS | cli.HEADLESS | cli.OWN_COMMANDS


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_the_top_level_help_lists_every_subcommand_one_line_each(capsys, flag):
    code, out, err = invoke(capsys, [flag])
    assert code == 0 and err == ""
    lines = out.splitlines()
    for name, summary in cli.SUMMARIES.items():
        assert [line for line in lines if line.split()[:1] == [name]] == [f"  {name:<9} {summary}"]


@pytest.mark.parametrize("name", list(cli.SUMMARIES))
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_each_subcommand_prints_its_help(capsys, name, flag):
    code, out, err = invoke(capsys, [name, flag])
    usage = "usage: trackside" if name == "demo" else f"usage: trackside {name}"
    assert (code, err) == (0, "") and out.startswith(usage), err


def test_an_unknown_command_is_one_line(capsys):
    code, out, err = invoke(capsys, ["bogus"])
    assert (code, out) == (2, "") and err == "trackside: 'bogus' is not a command (trackside --help lists them)\n"


# A bad invocation of each subcommand, and the start of the one line it says.
BAD = [
    (["--bogus"], "trackside: unrecognized arguments: --bogus"),
    (["demo", "--bogus"], "trackside: unrecognized arguments: --bogus"),
    (["launch"], "trackside launch: give the command after --"),
    (["launch", "--nproc-per-node", "2", "--", "true"], "trackside launch: --nproc-per-node goes with --hosts"),
    (["launch", "--nproc-per-node", "x", "--", "true"], "trackside launch: --nproc-per-node: expected"),
    (["runs", "--bogus"], "trackside: unrecognized arguments: --bogus"),
    (["gpus", "--host", "nope"], 'trackside: --host: no host named "nope"'),
    (["kill"], "trackside kill: the following arguments are required: RUN_OR_SESSION"),
    (["kill", "x", "--grace", "-1"], "trackside kill: --grace: expected"),
    (["relaunch", "nope"], "trackside: RUN: 'nope' is not a run id"),
    (["plot"], "trackside plot: the following arguments are required: RUN"),
    (["plot", "r", "--width", "3"], "trackside plot: --width: expected a number of cells"),
    (["watch", "--interval", "0"], "trackside watch: --interval: expected a number from 0.05"),
    (["watch", "--bogus"], "trackside watch: unrecognized arguments: --bogus"),
    (["serve", "--port", "0"], "trackside serve: --port: expected an integer from 1 to 65535"),
    (["serve", "--bogus"], "trackside serve: unrecognized arguments: --bogus"),
    (["train", "--max-seq-len", "10"], "trackside train: --max-seq-len: must be ≥ 128 (got 10)"),
    (["train", "--synthetic", "--lr", "abc"], "trackside train: --lr: 'abc' is not a number"),
    (["train"], "trackside train: one of the arguments --synthetic --data is required"),
    (["extract", "--bogus"], "trackside extract: the following arguments are required: --model, --prompts, --out"),
    (["extract", "--model", "/nonexistent", "--prompts", "PROMPTS", "--out", "OUT"], "trackside extract: --model: no such directory: /nonexistent"),
    (["fit", "--gpu-mem-gib", "abc"], "trackside fit: --gpu-mem-gib: invalid float value: 'abc'"),
    (["fit", "--preset", "nope"], "trackside fit: --preset must be one of"),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "said"), BAD, ids=[" ".join(argv) for argv, _ in BAD])
def test_a_bad_argument_is_one_line_exit_2(capsys, tmp_path, monkeypatch, argv, said):
    monkeypatch.setenv("HOME", str(tmp_path))  # no config file but this test's
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"input_ids": [1, 2, 3]}\n')
    argv = [str(prompts) if a == "PROMPTS" else str(tmp_path / "out") if a == "OUT" else a for a in argv]
    code, out, err = invoke(capsys, argv)
    assert code == 2 and out == "", err
    assert err.endswith("\n") and err.count("\n") == 1 and err.startswith(said), err
    assert not doubled(err) and "usage:" not in err and "Traceback" not in err, err


def test_an_unreachable_host_is_named_once(capsys, tmp_path):
    config = tmp_path / "config.toml"
    config.write_text('[hosts.gone]\naddress = "127.0.0.1"\nport = 1\n')
    for command in ("runs", "gpus"):
        code, out, err = invoke(capsys, [command, "--config", str(config)])
        assert code == 1 and err.startswith("trackside: gone: cannot connect") and err.count("\n") == 1, err
        assert not doubled(err), err
