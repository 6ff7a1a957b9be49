"""A user's directory synced for a trainer trackside did not write (issue 36, item 2):
`[[hosts.X.sync]]` sends it before a shipping launch or relaunch, over the same SSH
connection and prefix as everything else; excluded names (.git, checkpoints, data) are
neither sent nor touched on the host; only what changed travels; a tree over its cap is
one line, said before anything is sent."""

from __future__ import annotations

import json
from pathlib import Path

from backends import ship
from backends.ship import sync
from tests.backends.test_cli import cli
from tests.backends.test_runs import tmux_dir  # noqa: F401 (fixture)
from tests.backends.test_ship import cli_ok, host_table, sent, write_config  # noqa: F401 (fixture)

TRAIN = """\
import os, sys, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from settings import VALUE
print(f"value={VALUE}", flush=True)
time.sleep(600)
"""


def work_dir(tmp_path: Path) -> Path:
    """The user's trainer here, beside what is never to be sent."""
    work = tmp_path / "work" / "dflash"
    for path, text in {"train.py": TRAIN, "settings.py": "VALUE = 'old'\n", ".git/HEAD": "ref: refs/heads/main\n",
                       "checkpoints/step-9/model.bin": "local", "data/shard-0.bin": "local",
                       "__pycache__/stale.cpython-311.pyc": "stale"}.items():  # fmt: skip
        (work / path).parent.mkdir(parents=True, exist_ok=True)
        (work / path).write_text(text)
    return work


def box_dir(tmp_path: Path) -> Path:
    """Its place on the host, holding what only the host has."""
    box = tmp_path / "box" / "dflash"
    for path, text in {"checkpoints/step-1/model.bin": "host's", "data/shard-0.bin": "host's", "notes.txt": "host's"}.items():
        (box / path).parent.mkdir(parents=True, exist_ok=True)
        (box / path).write_text(text)
    return box


def sync_table(work: Path, box: Path, **settings) -> str:
    values = {"from": str(work), "to": str(box), **settings}
    return "[[hosts.gpu.sync]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items())


def printed(run_dir: str) -> str:
    return Path(run_dir, "console.log").read_text()


def test_a_foreign_trainers_directory_is_synced_with_excludes_and_only_changes_travel(capsys, tmp_path, sshd, runs_root, tmux_dir, sent):
    work, box = work_dir(tmp_path), box_dir(tmp_path)
    config = write_config(tmp_path, host_table(sshd, runs_root, tmux_dir) + sync_table(work, box))
    first = cli_ok(capsys, "launch", "--config", config, "--ship", "--", str(sshd.python), str(box / "train.py"))
    [synced] = first["shipped"]["synced"]
    assert first["shipped"]["code"] is None  # not the trainer: no package shipped for it
    assert (synced["from"], synced["to"], synced["exclude"]) == (str(work), str(box), list(sync.DEFAULT_EXCLUDE))
    assert first["shipped"]["sent"][0]["sent_files"] == ["settings.py", "train.py"]
    assert "value=old" in printed(first["run_dir"])
    # Excluded names: not sent, and the host's own left as they were.
    assert not (box / ".git").exists() and not (box / "__pycache__" / "stale.cpython-311.pyc").exists()
    assert sorted(p.relative_to(box).as_posix() for p in box.rglob("*") if p.is_file() and "__pycache__" not in p.parts) == [
        "checkpoints/step-1/model.bin", "data/shard-0.bin", "notes.txt", "settings.py", "train.py"]  # fmt: skip
    assert (box / "checkpoints/step-1/model.bin").read_text() == "host's" and (box / "notes.txt").read_text() == "host's"
    assert not list(box.parent.glob(".trackside-*"))  # nothing staged is left beside it

    (work / "settings.py").write_text("VALUE = 'new'\n")
    sent.clear()
    child = cli_ok(capsys, "relaunch", first["run_id"], "--config", config, "--ship")
    assert child["shipped"]["sent"][0]["sent_files"] == ["settings.py"] and len(sent) == 1
    assert "value=new" in printed(child["run_dir"]) and "value=old" in printed(first["run_dir"])
    sent.clear()
    again = cli_ok(capsys, "relaunch", child["run_id"], "--config", config, "--ship")
    assert sent == [] and again["shipped"]["sent"][0]["sent_bytes"] == 0

    listed = {r["run_id"]: r for r in cli_ok(capsys, "runs", "--config", config)}
    assert listed[first["run_id"]]["code"]["synced"][0]["to"] == str(box)
    assert listed[child["run_id"]]["code_changed"] is True and listed[again["run_id"]]["code_changed"] is False


def test_a_directory_over_its_cap_is_one_line_before_anything_is_sent(capsys, tmp_path, sshd, runs_root, tmux_dir, sent):
    work, box = work_dir(tmp_path), box_dir(tmp_path)
    (work / "weights.bin").write_bytes(b"\0" * (2 * ship.MIB))
    config = write_config(tmp_path, host_table(sshd, runs_root, tmux_dir) + sync_table(work, box, max_mib=1))
    code, out, err = cli(capsys, "launch", "--config", config, "--ship", "--", "sleep", "60")
    excludes = ", ".join(sync.DEFAULT_EXCLUDE)
    assert (code, out, err) == (1, "", f"trackside: {work}: 2.0 MiB to send after excludes ({excludes}), over the cap of 1 MiB\n")
    assert sent == [] and not (box / "weights.bin").exists() and not list(Path(runs_root).iterdir())

