"""Shipping the training package (issue 36): `launch|relaunch --ship` over a real sshd
with a container-like prefix sends the package to `<runs_root>/code/<hash>/` and runs
the trainer from there; only what changed travels, a tree already there sends nothing;
what goes wrong says so in one line before anything is launched.

The package shipped is a stand-in `training` package made in the test's directory (the
repository's is not edited): its trainer prints the VALUE of its `value.py` and writes
it into its start event, then waits."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from backends import runs, ship
from backends.hosts import SSHHost
from backends.logs import series
from tests.backends.test_cli import cli
from tests.backends.test_runs import tmux_dir  # noqa: F401 (fixture)

TRAINER = """\
import json, os, sys, time
from training.value import VALUE
out = sys.argv[sys.argv.index("--out") + 1]
print(f"value={VALUE}", flush=True)
with open(os.path.join(out, "metrics.jsonl"), "a") as f:
    f.write(json.dumps({"event": "start", "time": time.time(), "config": {"value": VALUE}}) + "\\n")
time.sleep(600)
"""
TRAIN = ["--", "trackside", "train", "--synthetic"]


def package(tmp_path: Path, value: str = "old") -> Path:
    """A `training` package whose trainer reports `value`; with bytecode that is not sent."""
    source = tmp_path / "src" / "training"
    (source / "__pycache__").mkdir(parents=True)
    (source / "__pycache__" / "value.cpython-311.pyc").write_bytes(b"not sent")
    (source / "__init__.py").write_text("")
    (source / "__main__.py").write_text(TRAINER)
    set_value(source, value)
    return source


def set_value(source: Path, value: str) -> None:
    (source / "value.py").write_text(f"VALUE = {value!r}\n")


def host_table(sshd, runs_root: str, tmux_dir: str, *, prefix: list[str] | None = None, **settings) -> str:
    """A [hosts.gpu] table for the test sshd; the prefix (a container's `pct exec 129 --`
    in life) sets the environment of every command run there."""
    if not sshd.running:
        sshd.start()
    values = {
        "address": sshd.address, "port": sshd.port, "user": sshd.user, "known_hosts": str(sshd.known_hosts),
        "identity_file": str(sshd.client_key), "runs_root": runs_root, "python": str(sshd.python),
        "prefix": prefix or ["env", f"TMUX_TMPDIR={tmux_dir}"], **settings,
    }  # fmt: skip
    return "[hosts.gpu]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items())


def write_config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return str(path)


@pytest.fixture
def sent(monkeypatch) -> list[int]:
    """The bytes of code given to the SSH host: the input of each command that unpacks a
    tree there (the others' input is a run's manifest)."""
    counts: list[int] = []
    run = SSHHost.run

    async def counting(self, argv, *, input=None, timeout=30.0):
        if any(ship._STAGE in arg for arg in argv):
            counts.append(len(input.encode()))
        return await run(self, argv, input=input, timeout=timeout)

    monkeypatch.setattr(SSHHost, "run", counting)
    return counts


def start_value(run_dir: str) -> str:
    return json.loads(Path(run_dir, "metrics.jsonl").read_text().splitlines()[0])["config"]["value"]


def cli_ok(capsys, *argv: str) -> dict:
    code, out, err = cli(capsys, argv[0], "--json", *argv[1:])
    assert code == 0, err
    return json.loads(out)


def test_relaunch_ship_runs_the_edited_code_and_a_second_sends_nothing(capsys, tmp_path, sshd, runs_root, tmux_dir, sent):
    source = package(tmp_path)
    config = write_config(tmp_path, host_table(sshd, runs_root, tmux_dir, ship_from=str(source)))
    first = cli_ok(capsys, "launch", "--config", config, "--ship", *TRAIN)
    whole = sum(sent)
    code = first["shipped"]["code"]
    assert code["dir"] == f"{runs_root}/code/{code['hash']}" and code["describe"] is None  # not a checkout
    assert sorted(first["shipped"]["sent"][0]["sent_files"]) == ["training/__init__.py", "training/__main__.py", "training/value.py"]
    assert start_value(first["run_dir"]) == "old"

    set_value(source, "new")
    sent.clear()
    child = cli_ok(capsys, "relaunch", first["run_id"], "--config", config, "--ship")
    assert child["shipped"]["sent"][0]["sent_files"] == ["training/value.py"]  # only what changed travels
    assert sent == [child["shipped"]["sent"][0]["sent_bytes"]] and sent[0] < whole, (sent, whole)
    assert start_value(child["run_dir"]) == "new" and child["shipped"]["code"]["hash"] != code["hash"]
    # The parent runs on, from its own tree: the old code.
    assert start_value(first["run_dir"]) == "old" and Path(code["dir"], "training", "value.py").read_text() == "VALUE = 'old'\n"
    assert "value=new" in Path(child["run_dir"], "console.log").read_text()
    listed = {r["run_id"]: r for r in cli_ok(capsys, "runs", "--config", config)}
    assert listed[first["run_id"]]["state"] == "running" and listed[child["run_id"]]["state"] == "running"

    sent.clear()
    again = cli_ok(capsys, "relaunch", child["run_id"], "--config", config, "--ship")
    assert sent == [] and again["shipped"]["sent"][0]["sent_bytes"] == 0  # the tree is there: nothing sent
    assert start_value(again["run_dir"]) == "new"

    # Without --ship, a child runs its parent's code, not what is here now.
    set_value(source, "newer")
    same = cli_ok(capsys, "relaunch", again["run_id"], "--config", config)
    assert "shipped" not in same and start_value(same["run_dir"]) == "new"

    # Seen: each run's code, and whether it changed from its parent's.
    listed = {r["run_id"]: r for r in cli_ok(capsys, "runs", "--config", config)}
    assert listed[first["run_id"]]["code"] == {"hash": code["hash"], "describe": None, "synced": []}
    assert listed[first["run_id"]]["code_changed"] is None  # no parent
    assert listed[child["run_id"]]["code_changed"] is True
    assert listed[again["run_id"]]["code_changed"] is False and listed[same["run_id"]]["code_changed"] is False


def test_the_host_setting_ships_by_default_and_no_ship_does_not(capsys, tmp_path, sshd, runs_root, tmux_dir):
    source = package(tmp_path)
    config = write_config(tmp_path, host_table(sshd, runs_root, tmux_dir, ship_from=str(source), ship=True))
    shipped = cli_ok(capsys, "launch", "--config", config, *TRAIN)
    assert start_value(shipped["run_dir"]) == "old" and shipped["shipped"]["code"]["hash"]
    code, out, err = cli(capsys, "launch", "--config", config, "--no-ship", "--session", "plain", "--", "sleep", "60")
    assert code == 0 and "shipped" not in out, err


def test_what_goes_wrong_is_one_line_and_nothing_is_launched(capsys, tmp_path, sshd, runs_root, tmux_dir):
    source = package(tmp_path)
    fakes = tmp_path / "fakes"
    fakes.mkdir()

    def fake(name: str, script: str) -> str:
        path = fakes / name
        path.write_text("#!/bin/sh\n" + script)
        path.chmod(0o755)
        return str(path)

    def fails(text: str, *argv: str) -> str:
        code, out, err = cli(capsys, *argv, "--config", write_config(tmp_path, text), *(TRAIN if argv[0] == "launch" else ()))
        assert code == 1 and out == "" and err.count("\n") == 1, err
        assert not [p for p in Path(runs_root).iterdir() if p.name != "code"], "a run was launched"
        return err

    def table(**settings) -> str:
        return host_table(sshd, runs_root, tmux_dir, ship_from=str(source), ship=True, **settings)

    err = fails(table(python=fake("old-python", "echo 3 8 True")), "launch")
    assert err == f"trackside: gpu: {fakes}/old-python is Python 3.8; the trainer needs 3.11 or newer (the host's `python` setting)\n"
    err = fails(table(python=fake("bare-python", "echo 3 12 False")), "launch")
    assert "bare-python has no torch" in err
    assert "gpu: no python3.99 on the host" in fails(table(python="python3.99"), "launch")
    # A host whose disk is nearly full (its df, inside the prefix, says 100 KiB free).
    fake("df", "printf 'Filesystem 1024-blocks Used Available Capacity Mounted\\nfake 1000 900 100 90%% /\\n'")
    full = ["env", f"TMUX_TMPDIR={tmux_dir}", f"PATH={fakes}:{os.environ['PATH']}"]
    assert "gpu: no room for training in " in fails(table(prefix=full), "launch")
    # A prefix that cannot write the runs root (here, one under a file).
    unwritable = host_table(sshd, f"{tmp_path / 'config.toml'}/runs", tmux_dir, ship_from=str(source), ship=True)
    assert f"gpu: cannot write {tmp_path}/config.toml/runs/code (inside its prefix): " in fails(unwritable, "launch")
    # A tree over its cap, said before the host is asked anything.
    (source / "weights.bin").write_bytes(b"\0" * ((ship.PACKAGE_MAX_MIB + 1) * ship.MIB))
    err = fails(table(), "launch")
    assert err == (f"trackside: {source}: 17.0 MiB to send after excludes (__pycache__, *.pyc), "
                   f"over the cap of {ship.PACKAGE_MAX_MIB} MiB\n")  # fmt: skip


def test_a_failed_ship_leaves_the_parent_running_and_launches_nothing(capsys, tmp_path, sshd, runs_root, tmux_dir):
    source = package(tmp_path)
    config = write_config(tmp_path, host_table(sshd, runs_root, tmux_dir, ship_from=str(source)))
    first = cli_ok(capsys, "launch", "--config", config, "--ship", *TRAIN)
    (source / "weights.bin").write_bytes(b"\0" * ((ship.PACKAGE_MAX_MIB + 1) * ship.MIB))
    code, out, err = cli(capsys, "relaunch", first["run_id"], "--config", config, "--ship")
    assert (code, out) == (1, "") and "over the cap" in err
    [listed] = cli_ok(capsys, "runs", "--config", config)
    assert listed["run_id"] == first["run_id"] and listed["state"] == "running"


async def test_a_half_sent_tree_is_never_there(tmp_path, ssh_host, runs_root):
    """The host unpacks into a directory of its own and renames it only once every file
    checks out: a tree that arrives short leaves nothing under code/."""
    source = package(tmp_path)
    host = SSHHost(ssh_host.name, ssh_host.address, user=ssh_host.user, port=ssh_host.port, known_hosts=ssh_host.known_hosts,
                   client_keys=ssh_host.client_keys, runs_root=runs_root)  # fmt: skip
    tree = ship.read_package(source)
    lying = ship.Tree(tree.root, {**tree.files, "training/value.py": "0" * 64}, tree.sizes, tree.under)
    with pytest.raises(ship.ShipError, match="the tree arrived incomplete"):
        await ship.stage(host, lying, runs_root, have={}, final=f"{runs_root}/code-x")
    assert os.listdir(runs_root) == []
    await host.close()


def test_describe_names_the_checkout_and_whether_it_is_dirty(tmp_path):
    source = package(tmp_path)
    git = ["git", "-C", str(source), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    clean = ship.describe(source)
    assert clean and not clean.endswith("-dirty")
    set_value(source, "new")
    assert ship.describe(source) == f"{clean}-dirty"


def test_the_lineage_legend_says_the_code_changed():
    old = {"hash": "1a2b3c4d" * 8, "describe": None, "synced": []}
    new = {"hash": "9f8e7d6c" * 8, "describe": None, "synced": []}
    assert series.changed({"ttt_steps": 3}, {"ttt_steps": 5}, old, new) == "ttt_steps 3 → 5, code 1a2b3c4 → 9f8e7d6"
    assert series.changed({}, {}, old, old) == "same params"
    assert series.changed({}, {}, None, new) == "code host's → 9f8e7d6"
    assert series.changed({}, {}) == "same params"
    assert runs.code_differs(None, None) is None


def test_the_default_package_is_this_tracksides_training_package():
    tree = ship.read_package(ship.local_package())
    assert "training/cli.py" in tree.files and "training/__main__.py" in tree.files
    assert not [p for p in tree.files if "__pycache__" in p or p.endswith(".pyc")]

