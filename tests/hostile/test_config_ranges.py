"""Numbers that mean "never" or "at once": every numeric setting of the config file, and
every flag that gives the same value, set to inf, nan, a negative, 1e17 or 0. Each is
refused before anything runs: exit 2, one line naming the key. Unchecked, `grace_s = inf`
was a kill that never sends SIGKILL, and `poll_ms = 1e17` a fleet that never refreshes and
says "ok".
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tui.commands import headless, serve, watch

REPO = Path(__file__).resolve().parents[2]
# TOML spells them so: `inf` and `nan` are floats of the file, as a careless edit writes them.
WRONG = {"inf": "inf", "nan": "nan", "-inf": "-inf", "negative": "-5", "huge": "1e17", "huge-int": "100000000000000000", "zero": "0"}
# (the key as its error names it, the table it sits in, the file around it)
SETTINGS = [
    ("defaults.grace_s", "[defaults]\ngrace_s = {}\n"),
    ("defaults.poll_ms", "[defaults]\npoll_ms = {}\n"),
    ("hosts.gpu1.port", '[hosts.gpu1]\naddress = "10.0.0.5"\nport = {}\n'),
    ("hosts.gpu1.max_channels", '[hosts.gpu1]\naddress = "10.0.0.5"\nmax_channels = {}\n'),
    ("hosts.gpu1.sync[0].max_mib", '[hosts.gpu1]\naddress = "10.0.0.5"\n[[hosts.gpu1.sync]]\nfrom = "/tmp"\nto = "/x"\nmax_mib = {}\n'),
    ("alerts.timeout_s", "[alerts]\ntimeout_s = {}\n"),
    ("alerts.stall_floor_s", "[alerts]\nstall_floor_s = {}\n"),
    ("alerts.underfed_s", "[alerts]\nunderfed_s = {}\n"),
]


def config(tmp_path: Path, template: str, value: str) -> str:
    path = tmp_path / "config.toml"
    path.write_text(template.format(value))
    return str(path)


@pytest.mark.parametrize("value", WRONG.values(), ids=WRONG.keys())
@pytest.mark.parametrize("key, template", SETTINGS, ids=[key for key, _ in SETTINGS])
def test_a_number_out_of_range_in_the_config_is_exit_2_naming_it(tmp_path, capsys, key, template, value):
    path = config(tmp_path, template, value)
    assert headless.main(["runs", "--config", path]) == 2  # before any host is read
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and f"{path}: {key}: expected " in err and "Traceback" not in err, err


@pytest.mark.parametrize("key, template", SETTINGS[:2], ids=["grace_s", "poll_ms"])
def test_every_command_refuses_it(tmp_path, capsys, key, template):
    """The dashboard, `watch` and `serve` read the same file: each says the same, exit 2."""
    path = config(tmp_path, template, "inf")
    assert watch.main(["--config", path, "--once"]) == 2
    assert serve.main(["--config", path, "--port", "1"]) == 2
    said = capsys.readouterr().err.splitlines()
    assert len(said) == 2 and all(f"{key}: expected " in line for line in said), said
    dashboard = subprocess.run([sys.executable, "-m", "tui.cli", "--config", path], cwd=REPO, capture_output=True, text=True,
                               timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
    assert dashboard.returncode == 2 and f"{key}: expected " in dashboard.stderr and "Traceback" not in dashboard.stderr


# The flags that give the same values: each refuses what its setting refuses, naming itself.
FLAGS = [
    (headless.main, ["kill", "some-session"], "--grace", []),
    (watch.main, ["--once"], "--interval", []),
    (headless.main, ["launch", "--hosts", "a,b"], "--nproc-per-node", ["--", "true"]),
    (serve.main, [], "--port", []),
    (serve.main, [], "--max-viewers", []),
]


def exit_status(main, argv: list[str]) -> int:
    """A command's exit status, whether its parser exits (argparse) or it returns one."""
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


@pytest.mark.parametrize("value", WRONG.values(), ids=WRONG.keys())
@pytest.mark.parametrize("main, before, flag, after", FLAGS, ids=[flag for _, _, flag, _ in FLAGS])
def test_a_flag_out_of_range_is_exit_2_naming_it(tmp_path, capsys, main, before, flag, after, value):
    argv = [*before, f"{flag}={value}", "--config", config(tmp_path, "[defaults]\n", ""), *after]
    assert exit_status(main, argv) == 2
    err = capsys.readouterr().err
    assert f"{flag}: expected " in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
