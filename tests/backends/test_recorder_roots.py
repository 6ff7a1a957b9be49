"""One recorder per runs root, on one tmux server: a command with another runs root (a
benchmark's temporary one) starts that root's recorder, and `record status` of each root
says its own; a recorder whose runs root or gpu/ was removed ends itself, and the other
root's goes on. Real tmux (this test's own server), the nvidia-smi stand-in."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from backends import tmux
from backends.recorder import layout
from tests.backends.test_runs import tmux_dir  # noqa: F401 - the fixture: this test's own tmux server
from tests.waiting import until
from tui.cli import main

FAKE_SMI = str(Path(__file__).resolve().parent.parent / "fake_nvidia_smi.py")


def config_for(tmp_path: Path, name: str) -> tuple[str, Path]:
    root = tmp_path / name / "runs"
    path = tmp_path / f"{name}.toml"
    path.write_text(f"[hosts.box]\nruns_root = {json.dumps(str(root))}\nnvidia_smi = {json.dumps(FAKE_SMI)}\n")
    return str(path), root


def recorders() -> dict[str, int]:
    """The runs root each recorder on this tmux server records into (its program's
    argument), and its pane's pid; one not yet running its program (or gone) is left out."""
    out = subprocess.run(["tmux", "list-panes", "-a", "-F", f"#{{pane_pid}} #{{{tmux.RECORDER_OPTION}}}"], capture_output=True, text=True).stdout
    found = {}
    for line in out.splitlines():
        pid, _, marked = line.partition(" ")
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if marked == "1" and argv[1:2] == [b"-c"] and len(argv) > 3:
            found[argv[3].decode()] = int(pid)
    return found


def samples_after(root: Path, t: float) -> int:
    try:
        text = (root / "gpu" / f"{layout.day_of(time.time())}.gpu").read_text()
    except FileNotFoundError:
        return 0
    return sum(1 for line in text.splitlines() if line.count(",") == 6 and float(line.split(",")[0]) > t)


def said(capsys, *argv: str) -> str:
    capsys.readouterr()
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def test_two_runs_roots_on_one_tmux_server_have_a_recorder_each(tmp_path, capsys, tmux_dir):  # noqa: F811
    first, first_root = config_for(tmp_path, "bench")
    second, second_root = config_for(tmp_path, "home")
    began = time.time()
    assert main(["runs", "--config", first]) == 0  # the first command starts its root's recorder
    assert said(capsys, "record", "status", "--config", second) == f"box: not running ({second_root}/gpu/)\n"
    assert said(capsys, "record", "start", "--config", second) == f"box: started ({second_root}/gpu/)\n"
    for root in (first_root, second_root):
        until(lambda root=root: samples_after(root, began) >= 2, 60, f"GPU samples in {root}/gpu")
    until(lambda: set(recorders()) == {str(first_root), str(second_root)}, 30, "a recorder for each root")
    assert said(capsys, "record", "status", "--config", first) == f"box: running ({first_root}/gpu/)\n"
    assert said(capsys, "record", "stop", "--config", second) == f"box: stopped ({second_root}/gpu/)\n"
    held = "not running: stopped by hand (no command starts it again but `trackside record start`)"
    assert said(capsys, "record", "status", "--config", second) == f"box: {held} ({second_root}/gpu/)\n"
    assert said(capsys, "record", "status", "--config", first) == f"box: running ({first_root}/gpu/)\n"
    until(lambda: set(recorders()) == {str(first_root)}, 30, "the first root's recorder alone")


@pytest.mark.parametrize("removed", ["the runs root", "gpu/"])
def test_a_recorder_whose_directory_was_removed_ends_and_the_other_goes_on(tmp_path, capsys, tmux_dir, removed):  # noqa: F811
    first, first_root = config_for(tmp_path, "bench")
    second, second_root = config_for(tmp_path, "home")
    assert main(["runs", "--config", first]) == 0
    assert main(["runs", "--config", second]) == 0
    began = time.time()
    for root in (first_root, second_root):
        until(lambda root=root: samples_after(root, began) >= 2, 60, f"GPU samples in {root}/gpu")
    until(lambda: set(recorders()) == {str(first_root), str(second_root)}, 30, "a recorder for each root")
    shutil.rmtree(first_root if removed == "the runs root" else first_root / "gpu")
    until(lambda: str(first_root) not in recorders(), 60, f"the recorder to end, {removed} removed")
    removed_at = time.time()
    assert said(capsys, "record", "status", "--config", first) == f"box: not running ({first_root}/gpu/)\n"
    assert main(["runs", "--config", second]) == 0  # the next command, for the other root
    assert said(capsys, "record", "status", "--config", second) == f"box: running ({second_root}/gpu/)\n"
    until(lambda: samples_after(second_root, removed_at) >= 2, 60, "the other root's recorder writing on")
    until(lambda: list(recorders()) == [str(second_root)], 30, "the other root's recorder alone")
