"""A synced or shipped tree's symbolic links (issue 42): never read through, so what a
link points at here never reaches the host. Each link is refused, named, in one line,
before anything is sent or launched. Over the loopback sshd, as a host is reached in life.
What ship leaves under the runs root is its user's alone (0600 files, 0700 directories)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tests.backends.test_cli import cli
from tests.backends.test_runs import tmux_dir  # noqa: F401 (fixture)
from tests.backends.test_ship import TRAIN, cli_ok, host_table, package, write_config
from tests.backends.test_sync import box_dir, sync_table, work_dir

pytestmark = pytest.mark.slow

SECRET = "root only: this machine's\n"


def secret(tmp_path: Path) -> Path:
    path = tmp_path / "secret"
    path.write_text(SECRET)
    path.chmod(0o600)
    return path


def plant(tree: Path, tmp_path: Path) -> list[str]:
    """Links in `tree` to what is not to leave this machine; their names."""
    (tree / "leak").symlink_to(secret(tmp_path))
    (tree / "shadow").symlink_to("/etc/shadow")
    (tree / "etc").symlink_to("/etc", target_is_directory=True)
    return ["leak", "shadow", "etc"]


def refused(code: int, err: str, names: list[str]) -> None:
    lines = err.strip().splitlines()
    assert code != 0 and len(lines) == 1 and all(name in lines[0] for name in names), (code, err)


def leaked(where: Path) -> list[str]:
    """Files under `where` holding the secret or /etc/shadow's content."""
    shadow = Path("/etc/shadow").read_bytes() if Path("/etc/shadow").exists() else None
    found = []
    for path in where.rglob("*"):
        if path.is_file() and not path.is_symlink() and path.read_bytes() in (SECRET.encode(), shadow):
            found.append(str(path))
    return found


def test_a_synced_trees_links_are_refused_by_name_and_their_targets_never_sent(capsys, tmp_path, sshd, runs_root, tmux_dir):
    work, box = work_dir(tmp_path), box_dir(tmp_path)
    names = plant(work, tmp_path)
    config = write_config(tmp_path, host_table(sshd, runs_root, tmux_dir) + sync_table(work, box))
    code, _, err = cli(capsys, "launch", "--config", config, "--ship", "--", str(sshd.python), str(box / "train.py"))
    refused(code, err, names)
    assert leaked(box) == [] and not (box / "train.py").exists()  # nothing sent, nothing launched
    assert os.listdir(runs_root) == []


def test_a_shipped_packages_links_are_refused_by_name_and_their_targets_never_sent(capsys, tmp_path, sshd, runs_root, tmux_dir):
    source = package(tmp_path)
    names = plant(source, tmp_path)
    config = write_config(tmp_path, host_table(sshd, runs_root, tmux_dir, ship_from=str(source)))
    code, _, err = cli(capsys, "launch", "--config", config, "--ship", *TRAIN)
    refused(code, err, names)
    assert leaked(Path(runs_root)) == [] and not Path(runs_root, "code").exists() or not os.listdir(Path(runs_root, "code"))


def test_shipped_code_is_its_users_alone(capsys, tmp_path, sshd, runs_root, tmux_dir):
    source = package(tmp_path)
    config = write_config(tmp_path, host_table(sshd, runs_root, tmux_dir, ship_from=str(source)))
    launched = cli_ok(capsys, "launch", "--config", config, "--ship", *TRAIN)
    code = Path(launched["shipped"]["code"]["dir"])
    wrong = {}
    for path in [code, *code.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        if mode != (0o700 if path.is_dir() else 0o600):
            wrong[str(path.relative_to(code))] = oct(mode)
    assert wrong == {}
