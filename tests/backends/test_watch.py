"""`trackside watch`: each cause produced for real — a run that exits 1, one whose loss
turns NaN, one that stalls, a host whose sshd stops — printed once and handed once to the
alert command; a command that fails or hangs, and a bad config, are one line each."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from backends import runs
from backends.alerts import AlertBook, Rules
from backends.hosts import LocalHost
from backends.watch import Watched, watch
from scripts.local_box import end_tmux_server

# A stand-in trainer: launched as the host's train command, it is given `--out RUN_DIR`
# and writes step events to the run dir's metrics.jsonl as the real one does.
FAKE_TRAINER = """
import json, os, sys, time
mode, out = sys.argv[1], sys.argv[sys.argv.index("--out") + 1]
if mode == "slow-stop":  # as the trainer saves a checkpoint on SIGTERM before it ends
    import signal
    signal.signal(signal.SIGTERM, lambda *_: (time.sleep(3), sys.exit(0)))
with open(out + "/metrics.jsonl", "a") as metrics:
    def write(event):
        metrics.write(json.dumps(event) + "\\n")
        metrics.flush()
    for n in range(1, 100_000):
        loss = float("nan") if mode == "nan" and n > 5 else 10.0 if mode == "jump" and n > 10 else 2.0
        write({"event": "step", "time": time.time(), "step": n, "loss": loss})
        time.sleep(0.5 if mode == "jump" and n > 10 else 0.05)
        if n == 5 and mode == "fail":
            sys.exit(1)
        if n == 5 and mode == "oom":
            write({"event": "oom", "max_seq_len": 32768, "ttt_steps": 5})
            sys.exit(3)
        if n == 5 and mode == "stall":
            time.sleep(600)
        if mode == "fail-when" and os.path.exists(out + "/fail-now"):
            sys.exit(1)
"""
TRAIN_COMMAND = [sys.executable, "-c", FAKE_TRAINER]
RULES = Rules(stall_floor_s=1.0)
CAUSES = {"failed": "fail", "oom": "oom", "nan": "nan", "jump": "jump", "stall": "stall"}  # 5 steps 0.05 s apart: a stall after 1 s without one


@pytest.fixture
def local(tmp_path):
    host = LocalHost("local", runs_root=str(tmp_path / "runs"))
    host.tmux_socket = f"ts-watch-{uuid.uuid4().hex[:8]}"  # backends.tmux reads this attribute
    yield host
    end_tmux_server("tmux", "-L", host.tmux_socket)


def appender(path: Path) -> list[str]:
    return ["sh", "-c", 'cat >> "$1"', "sh", str(path)]


def sent(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def until(check, what: str, timeout: float = 20.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while not (found := check()):
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)
    return found


async def test_failed_oom_nan_jumping_and_stalled_runs_each_alert_once(local, tmp_path):
    book = AlertBook(rules=RULES)
    lines: list[str] = []
    got = tmp_path / "alerts.jsonl"
    launched = {}
    for mode in ("fail", "oom", "nan", "jump", "stall"):
        info = await runs.launch(local, [*TRAIN_COMMAND, mode], train_command=TRAIN_COMMAND, startup_s=0)
        launched[mode] = f"local/{info.run_id}"
    watcher = asyncio.create_task(
        watch([Watched(local)], book, command=appender(got), interval_s=0.2, say=lines.append)
    )
    try:
        wanted = {f"{cause}:{launched[mode]}" for cause, mode in CAUSES.items()}
        await until(lambda: wanted <= {alert["key"] for alert in sent(got)}, f"{wanted} sent", timeout=30)
        await asyncio.sleep(1.0)  # five more polls: nothing is sent twice
    finally:
        # awaited here, not left to the loop's close: that cancels a command's start midway
        # (backends/hosts/local.py, `started`), and a start cut there never ends
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    keys = [alert["key"] for alert in sent(got)]
    assert sorted(keys) == sorted(wanted), keys
    by_key = {alert["key"]: alert for alert in sent(got)}
    assert by_key[f"failed:{launched['fail']}"]["text"] == f"{launched['fail']} failed: exit status 1"
    assert by_key[f"oom:{launched['oom']}"]["text"] == f"{launched['oom']} ran out of GPU memory (max_seq_len=32768, ttt_steps=5)"
    # The first poll that sees the jump may come a step or two after it (each 0.5 s apart) on
    # a loaded machine: the alert names the newest step, which must be one of the jump's.
    jumped = re.fullmatch(rf"{re.escape(launched['jump'])} loss jumped to 10 at step (\d+) \(5\.0× its recent median 2\)",
                          by_key[f"jump:{launched['jump']}"]["text"])
    assert jumped and int(jumped[1]) > 10, by_key[f"jump:{launched['jump']}"]["text"]
    assert by_key[f"nan:{launched['nan']}"]["text"].startswith(f"{launched['nan']} loss is not finite at step ")
    assert by_key[f"stall:{launched['stall']}"]["text"].startswith(f"{launched['stall']} stalled: no step for ")
    said = [line for line in lines if "cleared" not in line]
    assert len(said) == 5 and all(line.split()[2] in ("error", "warning") for line in said), lines


async def test_a_host_whose_sshd_stops_is_lost_once_and_cleared_when_it_returns(fresh_sshd, tmp_path):
    host = fresh_sshd.host(runs_root=str(tmp_path / "runs"), prefix=["env", f"TMUX_TMPDIR={tmp_path}"])
    book = AlertBook()
    lines: list[str] = []
    got = tmp_path / "alerts.jsonl"
    hosts = [Watched(host)]

    async def once() -> int:
        return await watch(hosts, book, command=appender(got), once=True, say=lines.append)

    try:
        assert await once() == 0 and lines == []
        fresh_sshd.stop()
        assert await once() == 1
        assert await once() == 1  # still lost: said and sent once
        [alert] = sent(got)
        assert alert["key"] == "lost:sshd" and alert["severity"] == "error"
        assert len(lines) == 1 and "sshd lost: " in lines[0]
        fresh_sshd.start()
        while await once():  # the host's reconnection backs off (0.25 s, doubling) after failures
            await asyncio.sleep(0.2)
        assert len(lines) == 2 and "cleared" in lines[1] and len(sent(got)) == 1
    finally:
        await host.close()


async def test_a_busy_gpu_drawing_a_third_of_its_limit_is_under_fed(local):
    """The fake nvidia-smi replays an H200 at 99 % util, told to read 250 W of 700 W."""
    fake = Path(__file__).resolve().parents[1] / "fake_nvidia_smi.py"
    starved = LocalHost("gpu1", runs_root=local.runs_root, prefix=["env", "FAKE_NVIDIA_SMI_STATE=load", "FAKE_NVIDIA_SMI_NA=power.draw=250.00"])
    starved.tmux_socket = local.tmux_socket
    book = AlertBook(rules=Rules(underfed_s=0.5))
    lines: list[str] = []
    hosts = [Watched(starved, smi=str(fake))]
    assert await watch(hosts, book, once=True, say=lines.append) == 0  # not yet for long enough
    await asyncio.sleep(0.6)
    assert await watch(hosts, book, once=True, say=lines.append) == 1
    assert len(lines) == 1 and "under-fed GPU 0 on gpu1: 250 W of 700 W at >90% util for " in lines[0], lines


async def test_an_alert_command_that_fails_or_hangs_is_one_line(local, tmp_path):
    info = await runs.launch(local, [*TRAIN_COMMAND, "fail"], train_command=TRAIN_COMMAND, startup_s=0)
    await until(lambda: (Path(info.run_dir) / "exit_status").exists(), "the run's end")
    for command, said in [
        (["sh", "-c", "echo 'no route to hooks.example.org' >&2; exit 7"], "exited 7: no route to hooks.example.org"),
        (["sh", "-c", "sleep 30"], "did not finish within 0.5s: killed"),
    ]:
        lines: list[str] = []
        book = AlertBook(since=0.0)  # a watcher older than the run: its end is news
        started = asyncio.get_running_loop().time()
        assert await watch([Watched(local)], book, command=command, timeout_s=0.5, once=True, say=lines.append) == 1
        assert asyncio.get_running_loop().time() - started < 10
        assert len(lines) == 2 and lines[1].startswith("alert command sh -c ") and lines[1].endswith(said), lines


def trackside(*args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """`trackside watch …` as a user runs it, checking it never loads textual."""
    code = "import sys; from tui.cli import main; rc = main(sys.argv[1:]); assert 'textual' not in sys.modules; sys.exit(rc)"
    env = {**os.environ, "TMUX_TMPDIR": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path)}
    return subprocess.run([sys.executable, "-c", code, "watch", *args], capture_output=True, text=True, env=env, timeout=60)


def test_trackside_watch_once_on_a_quiet_host_and_on_a_bad_config(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text(f'[defaults]\nruns_root = "{tmp_path / "runs"}"\n[alerts]\ncommand = ["true"]\n')
    quiet = trackside("--config", str(config), "--once", tmp_path=tmp_path)
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, "", "")

    config.write_text('[alerts]\ncommand = ["curl", 3]\n')
    bad = trackside("--config", str(config), "--once", tmp_path=tmp_path)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr == f'trackside watch: {config}: alerts.command: expected a list of strings or a string, got ["curl", 3]\n'

    config.write_text("")
    absent = trackside("--config", str(config), "--host", "gpu9", tmp_path=tmp_path)
    assert absent.returncode == 2 and "--host: no host named" in absent.stderr and "Traceback" not in absent.stderr
