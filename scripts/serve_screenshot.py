"""screenshots/serve.png: `trackside serve`'s page in headless Chromium, on a run's screen.

    .venv/bin/python scripts/serve_screenshot.py

Real `trackside serve` on 127.0.0.1, the real page and browser (Debian's chromium). The
host is this machine with its own tmux server (a TMUX_TMPDIR of the script's own) and
the fake nvidia-smi (tests/fake_nvidia_smi.py: 8 H200s under load); its one session
prints an HF Trainer's log lines (a history, then one a second), which the run screen
reads from the pane as for any run trackside did not launch.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from scripts.browser import Browser, find_chromium  # noqa: E402
from scripts.local_box import end_tmux_server, write_smi_wrapper  # noqa: E402

OUT = REPO / "screenshots" / "serve.png"

# An HF Trainer's lines: a loss falling from 2.4 with some noise, the epoch, the lr.
TRAINER = r"""
import math, random, sys, time
random.seed(7)
def line(step):
    loss = 0.9 + 1.5 * math.exp(-step / 260) + random.gauss(0, 0.04)
    print({"loss": round(loss, 4), "grad_norm": round(1.1 + random.random() / 3, 3),
           "learning_rate": 2e-4, "epoch": round(step / 1600, 3)}, flush=True)
for step in range(10, 900, 10):
    line(step)
step = 900
while True:
    time.sleep(1)
    step += 10
    line(step)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def shoot(url: str) -> None:
    async with Browser(width=1280, height=760) as browser:
        await browser.open(url)
        await browser.wait_js("document.body.classList.contains('-first-byte')", what="the first draw")
        await browser.wait_text("hf-finetune", timeout=30)
        await browser.wait_text("W", timeout=30)  # the GPUs' power
        await asyncio.sleep(3)
        start = len(browser.frames)
        await browser.press("down")
        await browser.press("enter")
        await browser.wait_text("Log/lin y", start)
        await asyncio.sleep(6)  # the curve read from the pane's scrollback, a few samples of power
        await browser.screenshot(OUT)


def main() -> int:
    if find_chromium() is None:
        print("serve_screenshot: chromium is not installed (apt-get install chromium)", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="trackside-serve-shot-") as tmp_dir:
        tmp = Path(tmp_dir)
        (tmp / "tmux").mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith("TMUX")}
        env.update(TMUX_TMPDIR=str(tmp / "tmux"), COLUMNS="200")
        (tmp / "train.py").write_text(TRAINER)
        subprocess.run(
            ["tmux", "new-session", "-d", "-s", "hf-finetune", "-x", "200", "-y", "50", sys.executable, str(tmp / "train.py")],
            env=env, check=True,
        )  # fmt: skip
        config = tmp / "config.toml"
        config.write_text(
            f'[hosts.h200-box]\nruns_root = "{tmp / "runs"}"\nnvidia_smi = "{write_smi_wrapper(tmp)}"\n'
        )
        port, token = free_port(), secrets.token_urlsafe(16)
        serve = subprocess.Popen(
            [sys.executable, "-m", "tui.cli", "serve", "--port", str(port), "--config", str(config), "--token", token],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            time.sleep(2)
            asyncio.run(shoot(f"http://127.0.0.1:{port}/?token={token}"))
        finally:
            serve.send_signal(signal.SIGTERM)
            serve.wait(30)
            end_tmux_server("tmux", "-S", str(tmp / "tmux" / f"tmux-{os.getuid()}" / "default"))
    print(f"wrote {OUT.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
