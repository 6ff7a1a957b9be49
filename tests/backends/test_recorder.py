"""The GPU recorder for real: started by the first trackside command that reaches a host
over the loopback sshd, against the nvidia-smi stand-in (this machine has no GPU); killed
with SIGKILL, started again by the next command, the gap between shown by the reader;
never started where the config says `record = false`; `trackside record` by hand."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from backends import tmux
from backends.recorder import layout
from backends.recorder.read import read_recording
from backends.recorder.start import SESSION, session_of
from tests.backends.test_runs import tmux_dir  # noqa: F401 - the fixture: this test's own tmux server
from tests.waiting import until
from tui.cli import main

FAKE_SMI = str(Path(__file__).resolve().parent.parent / "fake_nvidia_smi.py")


@pytest.fixture
def remote(sshd, tmp_path):
    """A config whose one host is the test sshd, with a tmux server and runs root of its own."""
    if not sshd.running:
        sshd.start()
    remote_tmux = tempfile.mkdtemp(prefix="ts-tmux-rec-", dir="/tmp")
    procs = tmp_path / "procs.json"
    procs.write_text("[]")
    # The stand-in's switches in a wrapper: the recorder runs with the tmux server's
    # environment, which is not the command's that starts it.
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nFAKE_NVIDIA_SMI_GPUS=2 FAKE_NVIDIA_SMI_STATE=load FAKE_NVIDIA_SMI_PROCS={procs} exec {sys.executable} -S {FAKE_SMI} \"$@\"\n")
    smi.chmod(0o755)
    prefix = ["env", f"TMUX_TMPDIR={remote_tmux}"]
    root = tmp_path / "runs"

    def config(extra: str = "") -> str:
        path = tmp_path / "config.toml"
        path.write_text(
            f'[hosts.remote]\naddress = "{sshd.address}"\nport = {sshd.port}\nuser = "{sshd.user}"\n'
            f'known_hosts = "{sshd.known_hosts}"\nidentity_file = "{sshd.client_key}"\n'
            f"runs_root = {json.dumps(str(root))}\nnvidia_smi = {json.dumps(str(smi))}\nprefix = {json.dumps(prefix)}\n{extra}"
        )
        return str(path)

    def tmux_cmd(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["env", f"TMUX_TMPDIR={remote_tmux}", "tmux", *args], capture_output=True, text=True)

    yield config, tmux_cmd, root, sshd.host(runs_root=str(root), prefix=prefix)
    tmux_cmd("kill-server")
    shutil.rmtree(remote_tmux, ignore_errors=True)


def ticks(root: Path) -> list[str]:
    try:
        return (root / "gpu" / f"{layout.day_of(time.time())}.ticks").read_text().splitlines()
    except FileNotFoundError:
        return []


def samples_since(root: Path, t: float) -> list[str]:
    """The GPU sample lines written after `t` (today's file)."""
    try:
        text = (root / "gpu" / f"{layout.day_of(time.time())}.gpu").read_text()
    except FileNotFoundError:
        return []
    return [line for line in text.splitlines() if line.count(",") == 6 and float(line.split(",")[0]) > t]


def test_the_first_command_starts_it_the_next_restarts_a_killed_one_and_the_gap_shows(remote, capsys):
    config, tmux_cmd, root, host = remote
    # A trainer in a tmux session of its own holds GPU 1: its process is the pane's child.
    started = root.parent / "trainer.pid"
    tmux_cmd("new-session", "-d", "-s", "trainer", "sh", "-c", f"sleep 600 & echo $! > {started}; wait")
    trainer = int(until(lambda: started.exists() and started.read_text().strip(), 30, "the trainer's start"))
    trainer_pane = int(tmux_cmd("list-panes", "-t", "=trainer:", "-F", "#{pane_pid}").stdout)
    (root.parent / "procs.json").write_text(json.dumps([{"pid": trainer, "gpu": 1, "used_mib": 5000}]))
    began = time.time()
    assert main(["runs", "--config", config()]) == 0
    assert SESSION not in capsys.readouterr().out  # no listing takes the recorder for a run
    assert tmux_cmd("has-session", "-t", f"={session_of(str(root))}").returncode == 0
    until(lambda: len(samples_since(root, began)) >= 4, 60, "the recorder's first GPU samples")
    # One process tree, nothing under the runs root run: its pane runs python3 -c.
    pane = int(tmux_cmd("list-panes", "-t", f"={session_of(str(root))}:", "-F", "#{pane_pid}").stdout)
    python, dash_c = Path(f"/proc/{pane}/cmdline").read_bytes().split(b"\0")[:2]
    assert python.endswith(b"/python3") and dash_c == b"-c"

    assert main(["runs", "--config", config()]) == 0  # running: left as it is
    assert [line for line in ticks(root) if ",start," in line].__len__() == 1

    killed = time.time()
    os.killpg(pane, signal.SIGKILL)
    until(lambda: tmux_cmd("has-session", "-t", f"={session_of(str(root))}").returncode != 0, 30, "the killed recorder's session to end")
    next_command = time.time()
    assert main(["gpus", "--config", config()]) == 0  # the next command
    restarted = time.time()
    until(lambda: len(samples_since(root, restarted)) >= 2, 60, "GPU samples from the restarted recorder")
    seen = time.time()

    rec = asyncio.run(read_recording(host, began))
    starts = [float(line.split(",")[0]) for line in ticks(root) if ",start," in line]
    # Started by the next command: not before it began. Its start is written by the
    # recorder itself, which may come after the command returned (a loaded machine, CI).
    # (The recorder writes its times to the hundredth: rounded, one may read 5 ms later.)
    assert len(starts) == 2 and next_command < starts[1] + 0.005 and starts[1] < seen + 0.005, (next_command, starts, seen)
    assert [(g.start < killed, g.end) for g in rec.gaps] == [(True, starts[1])]
    before, after = [g for g in rec.gpus if g.time < killed], [g for g in rec.gpus if g.time > starts[1]]
    assert {g.index for g in before} == {g.index for g in after} == {0, 1}
    assert all(g.power_w and g.power_limit_w == 700.0 and g.uuid.startswith("GPU-") for g in rec.gpus)
    # What charges the GPU to the run: its process, told apart from a reused pid, its
    # parent the trainer session's pane.
    [held] = {(p.pid, p.gpu_uuid, p.start_ticks, p.used_mib, p.ancestors[0]) for p in rec.procs}
    ticks_22 = int(Path(f"/proc/{trainer}/stat").read_text().rsplit(")", 1)[1].split()[19])
    gpu1 = next(g.uuid for g in rec.gpus if g.index == 1)
    assert held == (trainer, gpu1, ticks_22, 5000.0, trainer_pane)
    assert ("", "trainer", trainer_pane) in {(p.socket, p.session, p.pane_pid) for p in rec.panes_at(time.time())}

    capsys.readouterr()
    assert main(["record", "status", "--config", config()]) == 0
    assert capsys.readouterr().out == f"remote: running ({root}/gpu/)\n"
    assert main(["record", "stop", "--config", config()]) == 0
    assert capsys.readouterr().out == f"remote: stopped ({root}/gpu/)\n"
    assert tmux_cmd("has-session", "-t", f"={session_of(str(root))}").returncode != 0


def test_a_recorder_stopped_by_hand_stays_stopped_until_started_by_hand(remote, capsys):
    """A death is restarted by the next command; `trackside record stop` is the operator's
    word, and no command but `record start` undoes it (a dashboard left open checks each
    minute: it would have undone it within one)."""
    config, tmux_cmd, root, _ = remote
    running = lambda: tmux_cmd("has-session", "-t", f"={session_of(str(root))}").returncode == 0  # noqa: E731
    assert main(["runs", "--config", config()]) == 0 and running()
    assert main(["record", "stop", "--config", config()]) == 0 and not running()
    assert main(["runs", "--config", config()]) == 0
    assert main(["gpus", "--config", config()]) == 0
    assert not running()
    capsys.readouterr()
    assert main(["record", "status", "--config", config()]) == 0
    assert capsys.readouterr().out.startswith("remote: not running: stopped by hand")
    assert main(["record", "stop", "--config", config()]) == 0  # stopped already: held still
    assert capsys.readouterr().out.startswith("remote: not running: stopped by hand")
    assert main(["record", "start", "--config", config()]) == 0 and running()
    assert capsys.readouterr().out.startswith("remote: started")
    # Started by hand, it is no longer held: a death is again the next command's to mend.
    pane = int(tmux_cmd("list-panes", "-t", f"={session_of(str(root))}:", "-F", "#{pane_pid}").stdout)
    os.killpg(pane, signal.SIGKILL)
    until(lambda: not running(), 30, "the killed recorder's session to end")
    assert main(["runs", "--config", config()]) == 0 and running()
    assert main(["record", "stop", "--config", config()]) == 0


async def test_a_dashboard_left_open_restarts_a_killed_recorder_by_itself(remote, monkeypatch):
    """No other command comes at night: the dashboard's own listings run the host's
    `on_reach` again each REACH_AGAIN_S, and the recorder killed meanwhile is back."""
    from backends.config import load_config
    from backends.hosts import base
    from tests.tui.conftest import wait_for
    from tui.app import TracksideApp
    from tui.watched import Watched

    config, tmux_cmd, root, _ = remote
    monkeypatch.setattr(base, "REACH_AGAIN_S", 3.0)
    entry = load_config(config()).host("remote")
    host = entry.make_host()
    app = TracksideApp([Watched(host, entry.nvidia_smi)], poll_interval=0.5)
    running = lambda: root.exists() and tmux_cmd("has-session", "-t", f"={session_of(str(root))}").returncode == 0  # noqa: E731
    starts = lambda: [line for line in ticks(root) if ",start," in line]  # noqa: E731
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: running() and len(starts()) == 1, 60, "the recorder started by the dashboard")
        pane = int(tmux_cmd("list-panes", "-t", f"={session_of(str(root))}:", "-F", "#{pane_pid}").stdout)
        os.killpg(pane, signal.SIGKILL)
        await wait_for(pilot, lambda: not running(), 30, "the killed recorder's session to end")
        await wait_for(pilot, lambda: running() and len(starts()) == 2, 60, "the recorder started again by the dashboard")
        # Running, it is left as it is: later checks start nothing.
        checked = host._reached_at
        await wait_for(pilot, lambda: host._reached_at != checked, 60, "the dashboard's next check")
        assert len(starts()) == 2, starts()


@pytest.mark.parametrize("where", ["[hosts.remote]", "[defaults]"])
def test_record_false_is_honoured(remote, capsys, where):
    config, tmux_cmd, root, host = remote
    path = config()
    text = Path(path).read_text()
    Path(path).write_text(text.replace("[hosts.remote]\n", "[hosts.remote]\nrecord = false\n") if where == "[hosts.remote]" else f"[defaults]\nrecord = false\n{text}")
    assert main(["runs", "--config", path]) == 0
    assert main(["gpus", "--config", path]) == 0
    # The command is over, and with it the only moment the recorder would have started.
    assert not [s for s in tmux_cmd("list-sessions", "-F", "#{session_name}").stdout.split() if s.startswith(SESSION)]
    assert not (root / "gpu").exists()
    assert main(["record", "start", "--config", path]) == 0  # by hand, it starts
    assert capsys.readouterr().out.endswith(f"remote: started ({root}/gpu/)\n")
    assert main(["record", "stop", "--config", path]) == 0


def test_the_recorder_session_is_marked_so_listings_skip_it():
    assert tmux.RECORDER_OPTION in " ".join(tmux.PANE_FIELDS)


@pytest.fixture
def local(tmp_path):
    from backends.hosts import LocalHost
    from scripts.local_box import end_tmux_server

    host = LocalHost("local", runs_root=str(tmp_path / "runs"))
    host.tmux_socket = f"ts-rec-{os.getpid()}-{time.monotonic_ns() % 10**9}"
    yield host
    end_tmux_server("tmux", "-L", host.tmux_socket)


def old_day(gpu: Path, t0: float, every_s: int = 10) -> None:
    """A whole day of one GPU as the recorder writes it, a sample every `every_s`."""
    day = layout.day_of(t0)
    lines = [f"{t0:.2f},0,GPU-0"] + [f"{t0 + s:.2f},0,{s % 600},700.00,1000,143771,50" for s in range(0, 86400, every_s)]
    (gpu / f"{day}.gpu").write_text("".join(f"{line}\n" for line in lines))
    (gpu / f"{day}.ticks").write_text("".join(f"{t0 + s:.2f}\n" for s in range(0, 86400, 5)))
    (gpu / f"{day}.procs").write_text(f"{t0:.2f},GPU-0,42,7,1000,1\n{t0 + 30:.2f}\n")


def test_old_days_are_downsampled_the_oldest_dropped_past_the_cap_and_hostile_files_left_alone(local, tmp_path):
    from backends.recorder import start

    gpu = Path(local.runs_root) / "gpu"
    gpu.mkdir(parents=True, mode=0o700)
    today = time.time() // 86400 * 86400
    ten, nine, three = today - 10 * 86400, today - 9 * 86400, today - 3 * 86400
    for t0 in (ten, nine, three):
        old_day(gpu, t0)
    outside = tmp_path / "outside"
    outside.write_text("not the recorder's\n")
    (gpu / f"{layout.day_of(nine)}.logs").symlink_to(outside)  # a link: never read, moved nor removed
    (gpu / f"{layout.day_of(nine)}.panes").write_bytes(b"\x1b[2J" + b"x" * (5 << 20) + b"\n\xff\xfe garbage\n")
    theirs = gpu / f"{layout.day_of(today - 8 * 86400)}.panes"
    theirs.write_text("1,2,3\n")
    theirs.chmod(0o666)  # another user could have written it: never opened
    kept = sum(p.stat().st_size for p in gpu.iterdir() if p.name.startswith(layout.day_of(three)))
    settings = start.Settings(tick_s=1, loop_ms=200, cap_bytes=kept + 150_000)

    assert asyncio.run(start.recorder(local, "start", FAKE_SMI, settings)) == "started"
    until(lambda: (gpu / f"{layout.day_of(time.time())}.ticks").exists(), 60, "the recorder's start, after its rotation")
    names = sorted(p.name for p in gpu.iterdir())
    assert not [n for n in names if n.startswith(layout.day_of(ten))]  # past the cap: gone
    assert f"{layout.day_of(nine)}.gpu" not in names and f"{layout.day_of(nine)}.gpu.1m" in names
    assert f"{layout.day_of(nine)}.panes.1m" in names and (gpu / f"{layout.day_of(nine)}.panes.1m").read_bytes() == b""
    assert (gpu / f"{layout.day_of(nine)}.logs").is_symlink() and outside.read_text() == "not the recorder's\n"
    assert theirs.read_text() == "1,2,3\n" and theirs.name + ".1m" not in names
    assert f"{layout.day_of(three)}.gpu" in names  # within 7 days: whole
    made = [n for n in names if n.endswith(".1m") or n.startswith(layout.day_of(time.time()))]
    assert made and all((gpu / n).stat().st_mode & 0o777 == 0o600 for n in made)  # this user's alone

    rec = asyncio.run(read_recording(local, nine, nine + 86400))
    assert rec.coarse_before == nine + 86400
    assert len(rec.gpus) == 1440 and rec.gpus[1].time == nine + 60 and rec.gpus[1].power_w == pytest.approx(sum(range(60, 120, 10)) / 6)
    assert rec.procs == () and rec.proc_times == (nine,)  # the minute's last snapshot found none
    assert rec.gaps == ()
    assert asyncio.run(start.recorder(local, "stop", FAKE_SMI)) == "stopped"


@pytest.mark.parametrize("hostile", ["root writable by others", "gpu/ a link"])
def test_a_runs_root_another_user_could_change_is_refused_and_nothing_starts(tmp_path, capsys, tmux_dir, hostile):  # noqa: F811
    root = tmp_path / "runs"
    root.mkdir(mode=0o700)
    if hostile == "root writable by others":
        root.chmod(0o777)
    else:
        (tmp_path / "elsewhere").mkdir()
        (root / "gpu").symlink_to(tmp_path / "elsewhere")
    config = tmp_path / "config.toml"
    config.write_text(f"[hosts.box]\nruns_root = {json.dumps(str(root))}\nnvidia_smi = {json.dumps(FAKE_SMI)}\n")
    # The command says what it says of such a root (a listing refuses one others can write).
    assert main(["runs", "--config", str(config)]) == (2 if hostile == "root writable by others" else 0)
    assert main(["record", "start", "--config", str(config)]) == 1
    assert "refused" in capsys.readouterr().err
    sessions = subprocess.run(["tmux", "list-sessions", "-F", "#{session_name}"], capture_output=True, text=True).stdout
    assert not [s for s in sessions.split() if s.startswith(SESSION)]
    assert not list((tmp_path / "elsewhere").iterdir()) if hostile == "gpu/ a link" else not (root / "gpu").exists()
