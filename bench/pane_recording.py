"""What recording a pane costs: the bytes on disk and the CPU of its recorder (`sh` and `dd`
under `tmux pipe-pane`), for a trainer that redraws a tqdm bar 20 times a second and prints
a loss line every second, as busy a console as trainers print.

    python3 bench/pane_recording.py [--seconds 60]

Runs on this machine's tmux, on a private socket, with the recording under a temporary
runs root; prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backends import runs  # noqa: E402
from backends.hosts import LocalHost  # noqa: E402

TRAINER = r"""
import sys, time
n = 0
while True:
    n += 1
    sys.stdout.write(f"\r{n % 100:3d}%|█████     | {n}/100000 [01:00<10:00, 20.00it/s, loss={2 - n / 1e5:.4f}]")
    if n % 20 == 0:
        sys.stdout.write("\n" + str({"loss": round(2 - n / 1e5, 4), "grad_norm": 0.5, "epoch": n / 1e5}) + "\n")
    sys.stdout.flush()
    time.sleep(0.05)
"""
TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def recorder_pids(root: str) -> list[int]:
    """The pipe's processes (tmux forks them from its server, not from the pane): the
    recorder's sh, given its log under the runs root `root`, and the head it runs."""
    shells, parents = [], {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmd = (proc / "cmdline").read_bytes().split(b"\0")
                parents[int(proc.name)] = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            if any(c.startswith(f"{root}/panes/".encode()) and c.endswith(b".log") for c in cmd):
                shells.append(int(proc.name))
    return shells + [pid for pid, ppid in parents.items() if ppid in shells]


async def main(seconds: float) -> dict:
    socket = f"bench-rec-{os.getpid()}"
    with tempfile.TemporaryDirectory() as root:
        host = LocalHost(runs_root=root)
        host.tmux_socket = socket
        script = Path(root) / "trainer.py"
        script.write_text(TRAINER)
        subprocess.run(["tmux", "-L", socket, "new-session", "-d", "-s", "t", "-x", "80", "-y", "24", sys.executable, str(script)], check=True)
        try:
            await runs.list_runs(host)  # the first listing starts the recording
            pids = recorder_pids(root)
            before = sum(cpu_s(p) for p in pids)
            started = time.monotonic()
            await asyncio.sleep(seconds)
            used = sum(cpu_s(p) for p in pids) - before
            elapsed = time.monotonic() - started
            logs = list(Path(root, "panes").rglob("*.log*"))
            written = sum(p.stat().st_size for p in logs)
        finally:
            subprocess.run(["tmux", "-L", socket, "kill-server"], check=False)
    return {
        "seconds": round(elapsed, 1), "recorder_processes": len(pids), "cpu_s": round(used, 3),
        "cpu_percent_of_one_core": round(100 * used / elapsed, 3), "bytes": written,
        "bytes_per_hour": round(written / elapsed * 3600), "redraws_per_s": 20, "lines_per_s": 1,
    }  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    print(json.dumps(asyncio.run(main(parser.parse_args().seconds))))
