"""What N viewers of `trackside serve` cost one host: SSH connections and channels opened
on it, and CPU on both sides. docs/serve.md holds the figures.

    .venv/bin/python tests/tui/serve_load.py --viewers 1 5 20 --seconds 30

The host is the test OpenSSH server (tests/sshd.py) on 127.0.0.1 at LogLevel VERBOSE, so
its log names every connection ("Accepted publickey") and every channel's command
("Starting session"); its nvidia-smi is tests/fake_nvidia_smi.py with 8 H200s under load
and its tmux server (its own TMUX_TMPDIR) runs one session printing a loss a second. The
viewers are plain websocket clients that read every frame (a browser's page does no more
on the server's side), all on the fleet screen at 160 x 45. For each N: open N viewers,
let them settle (--settle seconds), then count over --seconds; then close them all and
wait for their dashboards to end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from scripts.local_box import write_smi_wrapper  # noqa: E402
from tests.sshd import Sshd  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")
TOKEN = secrets.token_urlsafe(16)  # what `trackside serve` asks of every request


def tree(root: int) -> list[int]:
    """`root` and every process under it, now."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    found, frontier = [root], [root]
    while frontier:
        frontier = [pid for pid, parent in parents.items() if parent in frontier]
        found += frontier
    return found


def cpu_s(pids: list[int]) -> dict[int, float]:
    """Each process's CPU seconds, its reaped children's included (the short commands a
    sshd session runs end inside the window: their time lands in the session's cutime)."""
    out = {}
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        out[pid] = sum(int(f) for f in fields[11:15]) / TICKS  # utime stime cutime cstime
    return out


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def rss_mib(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            total += int(re.search(r"VmRSS:\s+(\d+)", Path(f"/proc/{pid}/status").read_text())[1])
        except (OSError, TypeError):
            continue
    return total / 1024


def used(before: dict[int, float], after: dict[int, float]) -> float:
    return sum(after[pid] - before.get(pid, 0.0) for pid in after)


async def viewer(url: str, stop: asyncio.Event, got: list[int]) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(f"{url}/ws?width=160&height=45&token={TOKEN}", heartbeat=None) as ws:
            while not stop.is_set():
                try:
                    message = await asyncio.wait_for(ws.receive(), 0.5)
                except TimeoutError:
                    continue
                if message.type == aiohttp.WSMsgType.BINARY:
                    got[0] += len(message.data)
                elif message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):
                    return


async def until_up(url: str, serve: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                async with session.get(f"{url}/alive?token={TOKEN}") as answer:
                    if answer.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            if serve.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"trackside serve did not start (exit {serve.poll()})")
            await asyncio.sleep(0.2)


async def measure(args) -> list[dict]:
    tmp = Path(tempfile.mkdtemp(prefix="trackside-serve-load-"))
    sshd = Sshd(tmp / "sshd")
    (tmp / "tmux").mkdir()
    text = sshd.config.read_text().replace("LogLevel INFO", "LogLevel VERBOSE")
    sshd.config.write_text(text.replace("SHLVL=1", f"SHLVL=1 TMUX_TMPDIR={tmp / 'tmux'}"))
    sshd.start()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TMUX")} | {"TMUX_TMPDIR": str(tmp / "tmux")}
    loop = 'i=0; while true; do i=$((i+1)); echo "step=$i loss=$((100 - i % 50))"; sleep 1; done'
    subprocess.run(["tmux", "new-session", "-d", "-s", "steps", loop], env=env, check=True)
    config = tmp / "config.toml"
    config.write_text(
        f'[hosts.gpu]\naddress = "127.0.0.1"\nport = {sshd.port}\nuser = "{sshd.user}"\n'
        f'known_hosts = "{sshd.known_hosts}"\nidentity_file = "{sshd.client_key}"\n'
        f'runs_root = "{tmp / "runs"}"\nnvidia_smi = "{write_smi_wrapper(tmp)}"\n'
    )
    port = args.port
    serve = subprocess.Popen(
        [sys.executable, "-m", "tui.cli", "serve", "--port", str(port), "--config", str(config),
         "--max-viewers", str(max(args.viewers)), "--token", TOKEN],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    results = []
    try:
        await until_up(url, serve)
        for n in args.viewers:
            stop, got = asyncio.Event(), [0]
            log_start = len(sshd.log.read_text())
            opened = time.monotonic()
            serve_at_open = cpu_s(tree(serve.pid))
            tasks = [asyncio.create_task(viewer(url, stop, got)) for _ in range(n)]
            await asyncio.sleep(args.settle)
            serve_pids, sshd_pids = tree(serve.pid), tree(sshd._proc.pid)
            start_cpu = used(serve_at_open, cpu_s(serve_pids))  # the dashboards' start-up, mostly
            log_mark = len(sshd.log.read_text())
            serve_before, sshd_before, bytes_before = cpu_s(serve_pids), cpu_s(sshd_pids), got[0]
            await asyncio.sleep(args.seconds)
            serve_after, sshd_after = cpu_s(tree(serve.pid)), cpu_s(tree(sshd._proc.pid))
            log = sshd.log.read_text()
            settling, window = log[log_start:log_mark], log[log_mark:]
            row = {
                "viewers": n,
                "dashboards": len(tree(serve.pid)) - 1,
                "ssh_connections_opened": settling.count("Accepted publickey") + window.count("Accepted publickey"),
                "ssh_connections_open": sum(cmdline(p).endswith("@notty") for p in tree(sshd._proc.pid)),
                "channels_in_settling": settling.count("Starting session"),
                "channels_per_min": round(window.count("Starting session") * 60 / args.seconds, 1),
                "serve_cpu_s_settling": round(start_cpu, 1),
                "serve_cpu_cores": round(used(serve_before, serve_after) / args.seconds, 3),
                "host_cpu_cores": round(used(sshd_before, sshd_after) / args.seconds, 3),
                "dashboards_rss_mib": round(rss_mib(tree(serve.pid)), 1),
                "kib_per_s_to_viewers": round((got[0] - bytes_before) / 1024 / args.seconds, 1),
                "settle_s": args.settle,
                "window_s": args.seconds,
            }
            print(json.dumps(row), flush=True)
            results.append(row)
            stop.set()
            for failed in await asyncio.gather(*tasks, return_exceptions=True):
                if failed is not None:
                    print(f"a viewer failed: {failed!r}", file=sys.stderr)
            deadline = time.monotonic() + 60
            while len(tree(serve.pid)) > 1 and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
            await asyncio.sleep(max(0.0, 3 - (time.monotonic() - opened)))
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(30)
        subprocess.run(["tmux", "kill-server"], env=env)
        sshd.stop()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--viewers", type=int, nargs="+", default=[1, 5, 20])
    parser.add_argument("--seconds", type=float, default=30.0, help="the counting window")
    parser.add_argument("--settle", type=float, default=20.0, help="after the viewers open, before counting")
    parser.add_argument("--port", type=int, default=18790)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    results = asyncio.run(measure(args))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
