"""Bad input never crashes the dashboard: each case is shown as state.

Malformed metrics and console lines, a run dir deleted under it, nvidia-smi missing, a
host that refuses connections and one that refuses our key — all in running apps.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path

from backends import runs
from tests.tui.conftest import screen_text, wait_for
from tui.commands.dashboard import dashboard
from tui.screens.run import RunScreen

PROGRESS = "Loading safetensors checkpoint shards:  19%|█▉        | 12/64 [00:10<00:42,  1.21it/s]"
GARBAGE = [
    "not json at all",
    "[1, 2, 3]",
    '{"event": "step", "step": 1, "loss": ',  # cut mid-line by a crash
    "\x00\xff\xfe binary",
    '{"no_event_key": true}',
    "{" * 5000,
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_config(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def append(path: str, lines: list[str]) -> None:
    with open(path, "a", encoding="utf-8", errors="surrogateescape") as f:
        f.write("".join(line + "\n" for line in lines))


async def test_garbage_lines_missing_smi_refused_host_and_deleted_run_dir(tmp_path, tmux_socket):
    config = write_config(
        tmp_path / "config.toml",
        f"""
        [hosts.box]
        runs_root = "{tmp_path}/runs"
        nvidia_smi = "{tmp_path}/no-such-nvidia-smi"

        [hosts.refuses]
        address = "127.0.0.1"
        port = {free_port()}
        """,
    )
    app = dashboard(config)
    box = app.watched["box"].host
    box.tmux_socket = tmux_socket
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.hosts["refuses"].status == "offline", 20, "the refusing host to read offline")
        assert "refused" in app.hosts["refuses"].message.lower() or "connect" in app.hosts["refuses"].message.lower()
        assert "refuses" in screen_text(app) and "offline" in screen_text(app)

        info = await runs.launch(box, ["sleep", "300"], session="tui-garbage")
        key = f"box/{info.run_id}"
        await wait_for(pilot, lambda: key in app.runs, 20, "the run in the fleet")
        app.open_run(key)
        await pilot.pause()
        assert isinstance(app.screen, RunScreen)
        await wait_for(pilot, lambda: "no GPU on this machine" in screen_text(app), 10, "the missing nvidia-smi")

        append(f"{info.run_dir}/console.log", ["\x1b[31mwarming up\x1b[0m", "\r".join(["x", PROGRESS])])
        run = app.runs[key]
        await wait_for(pilot, lambda: run.progress is not None, 20, "the loading progress")
        # Drawn at the screen's next refresh, not in the same breath as the state changed.
        await wait_for(pilot, lambda: "loading: 12/64" in screen_text(app), 10, "the loading progress drawn")

        step = '{"event": "step", "time": 1.0, "step": 7, "loss": 3.25, "loss_ttt": [3.0, 3.5]}'
        append(f"{info.run_dir}/metrics.jsonl", GARBAGE + [step])
        await wait_for(pilot, lambda: run.steps, 20, "the one good step")
        assert run.garbled == len(GARBAGE)
        await wait_for(pilot, lambda: "loss 3.25" in screen_text(app), 10, "the good step's loss drawn")
        await wait_for(pilot, lambda: "unreadable metrics lines skipped" in screen_text(app), 10, "the skipped lines said")

        shutil.rmtree(info.run_dir)
        await wait_for(pilot, lambda: run.gone, 20, "the deleted run dir to show")
        await wait_for(pilot, lambda: "run directory is gone" in screen_text(app), 10, "the deleted run dir drawn")
        await pilot.pause(1.0)
        assert app.is_running


async def test_host_that_refuses_our_key(tmp_path, sshd):
    if not sshd.running:
        sshd.start()
    stranger = tmp_path / "stranger_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    config = write_config(
        tmp_path / "config.toml",
        f"""
        [hosts.locked]
        address = "127.0.0.1"
        port = {sshd.port}
        user = "{sshd.user}"
        known_hosts = "{sshd.known_hosts}"
        identity_file = "{stranger}"
        """,
    )
    app = dashboard(config)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.hosts["locked"].status == "auth", 20, "the auth failure")
        assert "refused our keys" in screen_text(app)
