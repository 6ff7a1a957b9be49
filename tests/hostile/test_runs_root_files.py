"""Files under a runs root (issue 42): what another user planted there is never run nor
written through, a runs root another user can change is refused in one line naming it,
what trackside writes there is its user's alone (0600 files, 0700 directories), and a
full disk neither ends a recording nor leaves an empty run dir.

The attacker is uid 65534 (nobody): the test makes its files and chowns them. The disk
is a small tmpfs mounted for the test (root only, as are the chowns)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import re
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from backends import runs, tmux
from backends.hosts import HostError, LocalHost
from backends.logs import recording
from tests.backends.test_cli import cli, cli_json, config  # noqa: F401 (fixture)
from tests.backends.test_kill import FAKE_SMI
from tests.backends.test_runs import eventually, tmux_dir  # noqa: F401 (fixture)
from tests.backends.test_ship import host_table, write_config

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="chowns files to another user and mounts a tmpfs: needs root")

NOBODY = 65534
# The pipe script trackside up to 47d91dc wrote under <runs_root>/panes/ when it was
# absent, and had tmux run: the name another user plants.
OLD_RECORD_SCRIPT = "record-10830290.sh"
# A line every 10 ms, each numbered, long enough that a few fill a tmpfs page.
PRINTER = "import itertools, time\nfor i in itertools.count():\n    print(f'line {i:07d} ' + 'x' * 80, flush=True)\n    time.sleep(0.01)\n"


def box_config(tmp_path: Path, root: Path) -> str:
    path = tmp_path / "config.toml"
    path.write_text(f"[hosts.box]\nruns_root = {json.dumps(str(root))}\nnvidia_smi = {json.dumps(FAKE_SMI)}\n")
    return str(path)


def session(name: str, *command: str) -> tmux.Pane:
    subprocess.run(["tmux", "new-session", "-d", "-s", name, "-x", "200", "-y", "50", *command], check=True)
    [pane] = asyncio.run(tmux.list_panes(LocalHost(), name))
    return pane


def piped(pane: tmux.Pane) -> str:
    return subprocess.run(["tmux", "display-message", "-p", "-t", pane.pane_id, "#{pane_pipe}"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip


def nobodys(path: Path, mode: int) -> Path:
    os.chown(path, NOBODY, NOBODY, follow_symlinks=False)
    if not path.is_symlink():
        path.chmod(mode)
    return path


def one_refusal(code: int, err: str, names: Path) -> None:
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and str(names) in lines[0], (code, err)


@pytest.mark.parametrize("where", ["root writable by all", "root another user's", "panes dir another user's"])
def test_a_planted_record_script_is_never_run_and_its_runs_root_is_refused(capsys, tmp_path, tmux_dir, where):
    root = tmp_path / "runs"
    root.mkdir()
    panes = root / "panes"
    panes.mkdir()
    ran = tmp_path / "ran"
    planted = panes / OLD_RECORD_SCRIPT
    planted.write_text(f"touch {ran}\nexec cat > /dev/null\n")
    nobodys(planted, 0o755)
    if where == "root writable by all":
        root.chmod(0o777)
        nobodys(panes, 0o777)
        named = root
    elif where == "root another user's":
        nobodys(root, 0o755)
        nobodys(panes, 0o755)
        named = root
    else:
        nobodys(panes, 0o755)
        named = panes
    pane = session("job", "sh", "-c", "echo hello; sleep 60")

    code, _, err = cli(capsys, "runs", "--config", box_config(tmp_path, root))
    one_refusal(code, err, named)
    assert piped(pane) == "0" and not ran.exists()  # nothing started, so nothing of theirs ran


@pytest.mark.slow
def test_a_runs_root_another_user_can_write_is_refused_over_ssh(capsys, tmp_path, sshd, tmux_dir):
    root = tmp_path / "runs"
    root.mkdir()
    root.chmod(0o777)
    session("job", "sh", "-c", "echo hello; sleep 60")
    config = write_config(tmp_path, host_table(sshd, str(root), tmux_dir))
    for argv in (["runs"], ["launch", "--", "sh", "-c", "echo hello"]):
        code, _, err = cli(capsys, argv[0], "--config", config, *argv[1:])
        one_refusal(code, err, root)
    assert os.listdir(root) == []


def root_and_secret(tmp_path: Path, text: str) -> tuple[Path, Path]:
    """An empty runs root, and a file only root may read: what a planted link points at."""
    root = tmp_path / "runs"
    root.mkdir()
    secret = tmp_path / "secret"
    secret.write_text(text)
    secret.chmod(0o600)
    return root, secret


def test_a_planted_scrollback_link_leaves_the_file_it_points_at_untouched(capsys, tmp_path, tmux_dir):
    root, secret = root_and_secret(tmp_path, "root only\n")
    pane = session("job", "sh", "-c", "echo hello; sleep 60")
    # Where the listing records this pane: the attacker reads the name and time from tmux.
    rec = recording.recording_of(str(root), None, pane)
    here = Path(rec.directory)
    here.mkdir(parents=True)
    for d in (here, here.parent, here.parent.parent):
        nobodys(d, 0o777)
    link = Path(rec.scrollback)
    link.symlink_to(secret)
    nobodys(link, 0)

    code, _, err = cli(capsys, "runs", "--config", box_config(tmp_path, root))
    one_refusal(code, err, root / "panes")
    assert secret.read_text() == "root only\n" and piped(pane) == "0"


def _modes(root: Path) -> dict[str, str]:
    """Every file and directory under `root` (not itself) whose mode is not 0600 / 0700."""
    wrong = {}
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(top, name)
            mode = stat.S_IMODE(path.lstat().st_mode)
            if mode != (0o700 if path.is_dir() else 0o600):
                wrong[str(path.relative_to(root))] = oct(mode)
    return wrong


def test_every_file_of_a_launched_run_and_of_a_recording_is_its_users_alone(capsys, config, runs_root, tmp_path):
    trainer = cli_json(capsys, "launch", "--config", config, "--host", "box", "--", "trackside", "train", "--synthetic")
    ended = cli_json(capsys, "launch", "--config", config, "--host", "box", "--", "sh", "-c", "echo done")
    session("job", "sh", "-c", "echo hello; sleep 60")
    cli_json(capsys, "runs", "--config", config)  # records the foreign session's pane
    # The trainer's own files (its start event, its argv) and the ended run's exit status.
    eventually_files = [Path(trainer["run_dir"], "argv.json"), Path(trainer["run_dir"], "metrics.jsonl"), Path(ended["run_dir"], "exit_status")]
    asyncio.run(eventually(lambda: all(p.exists() for p in eventually_files)))
    assert any(Path(runs_root, "panes").rglob("*.scrollback"))
    assert _modes(Path(runs_root)) == {}


@contextlib.contextmanager
def small_disk(at: Path, size: str):
    at.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(at)], check=True)
    try:
        yield at
    finally:
        subprocess.run(["umount", "-l", str(at)], check=False)


def fill(disk: Path) -> Path:
    """A file taking every block left on `disk`."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f:
        while True:
            try:
                f.write(b"\0" * 4096)
            except OSError as e:
                assert e.errno == errno.ENOSPC
                return filler


def numbers(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"line (\d{7}) x{80}", text)]


async def last_shown(host, pane: tmux.Pane) -> int:
    return max(numbers((await tmux.capture_panes(host, [pane.pane_id])).get(pane.pane_id, "")) or [-1])


@pytest.mark.parametrize("what", ["a launched run's console.log", "a pane's recording"])
async def test_a_recording_goes_on_after_a_short_disk_full(tmp_path, tmux_dir, what):
    with small_disk(tmp_path / "disk", "256k") as disk:
        root = disk / "runs"
        root.mkdir(mode=0o700)
        host = LocalHost(runs_root=str(root))
        if what == "a launched run's console.log":
            launched = await runs.launch(host, [sys.executable, "-u", "-c", PRINTER], startup_s=0)
            pane = next(p for p in await tmux.list_panes(host, launched.session))
            log = Path(launched.run_dir, "console.log")
        else:
            subprocess.run(["tmux", "new-session", "-d", "-s", "job", "-x", "200", "-y", "50", sys.executable, "-u", "-c", PRINTER], check=True)
            [pane] = await tmux.list_panes(host, "job")
            await runs.list_runs(host)  # starts the pane's recording
            log = Path(recording.recording_of(str(root), None, pane).log)
        await eventually(lambda: log.exists() and len(numbers(log.read_text())) >= 5, timeout=30)
        filler = fill(disk)
        full_from = await last_shown(host, pane)
        # Two seconds of lines printed on a full disk: far more than the page it had left.
        await eventually(lambda: _shown_past(host, pane, full_from + 200), timeout=60)
        filler.unlink()
        freed_at = await last_shown(host, pane)
        await eventually(lambda: max(numbers(log.read_text()) or [-1]) > freed_at + 20, timeout=30)
        kept = set(numbers(log.read_text()))
        assert set(range(full_from, freed_at)) - kept  # the disk was full: lines went unrecorded
        subprocess.run(["tmux", "kill-server"], check=False)


async def _shown_past(host, pane: tmux.Pane, number: int) -> bool:
    return await last_shown(host, pane) >= number


async def test_a_launch_on_a_full_disk_leaves_no_run_dir(tmp_path, tmux_dir):
    with small_disk(tmp_path / "disk", "64k") as disk:
        root = disk / "runs"
        root.mkdir(mode=0o700)
        fill(disk)
        host = LocalHost(runs_root=str(root))
        with pytest.raises((HostError, runs.RunError), match="No space left|no room"):
            await runs.launch(host, ["sh", "-c", "echo hello"], startup_s=0)
        assert os.listdir(root) == []


def _recorder_pids(log: str) -> list[int]:
    """The processes of the pipe that records into `log` (tmux's child, started for this
    test's pane, and its children)."""
    found, parents = [], {}
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            if log.encode() in (proc / "cmdline").read_bytes().split(b"\0"):
                found.append(int(proc.name))
            parents[int(proc.name)] = int((proc / "stat").read_text().rpartition(")")[2].split()[1])
    return found + [pid for pid, parent in parents.items() if parent in found] if found else []


async def test_a_dead_recording_pipe_is_restarted_by_the_next_listing_and_says_so(tmp_path, tmux_dir, runs_root):
    host = LocalHost(runs_root=runs_root)
    ticker = textwrap.dedent("""\
        import itertools, time
        for i in itertools.count():
            print(f'tick {i}', flush=True)
            time.sleep(0.05)
    """)
    subprocess.run(["tmux", "new-session", "-d", "-s", "job", sys.executable, "-u", "-c", ticker], check=True)
    [pane] = await tmux.list_panes(host, "job")
    await runs.list_runs(host)
    rec = recording.recording_of(runs_root, None, pane)
    log, scrollback = Path(rec.log), Path(rec.scrollback)
    await eventually(lambda: log.exists() and b"tick" in log.read_bytes(), timeout=30)
    before = scrollback.read_bytes()
    pids = await eventually(lambda: _recorder_pids(rec.log))
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    await eventually(lambda: piped(pane) == "0", timeout=30)  # tmux sees the pipe gone at the pane's next line
    at = log.stat().st_size

    await runs.list_runs(host)
    assert piped(pane) == "1"
    note = r"\n\[trackside\] recording restarted at \S+: what the pane printed since it stopped is missing\n"
    said = await eventually(lambda: re.search(note + r"(.|\n)*tick", log.read_bytes().decode()), timeout=30)
    assert said.start() == at  # where the recording stopped
    assert scrollback.read_bytes() == before  # what the pane held at the first start, kept


def test_a_recording_swapped_for_a_link_is_refused_never_read_through(capsys, tmp_path, tmux_dir):
    root, secret = root_and_secret(tmp_path, "loss 0.123 root only\n")
    pane = session("job", "sh", "-c", "echo hello; sleep 60")
    config = box_config(tmp_path, root)
    assert cli(capsys, "runs", "--config", config)[0] == 0  # records the pane
    log = Path(recording.recording_of(str(root), None, pane).log)
    swap = log.with_name("swap")
    swap.symlink_to(secret)
    swap.replace(log)

    code, out, err = cli(capsys, "runs", "--config", config, "--json")
    one_refusal(code, err, log)
    assert "root only" not in out + err
