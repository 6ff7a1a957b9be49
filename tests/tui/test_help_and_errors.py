"""`trackside --help` lists every subcommand, each subcommand's --help is its usage
(exit 0), and a bad argument to any of them is one line on stderr, exit 2."""

from __future__ import annotations

import pytest

from tui import cli


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
