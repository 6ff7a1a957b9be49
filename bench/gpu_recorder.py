"""What the GPU recorder costs on a host (backends/recorder/): the bytes it writes a day
and the CPU of its processes, the real recorder started as any command starts it, on a
private tmux socket with a temporary runs root.

    python3 bench/gpu_recorder.py [--seconds 180] [--gpus 8] [--smi nvidia-smi]

Without --smi it reads the nvidia-smi stand-in (tests/fake_nvidia_smi.py) with --gpus
GPUs under load, each held by one live process. Its bytes a day are extrapolated from the
seconds it ran; its CPU is read from /proc: the recorder's python itself, what it ran and
reaped each tick (nvidia-smi --query-compute-apps, tmux), and the `nvidia-smi -lms` loop
(with the stand-in, a python standing in for nvidia-smi: no figure of the real one's).
Prints one JSON line.
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from backends.hosts import LocalHost  # noqa: E402
from backends.recorder import start  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def cpu(pid: int) -> tuple[float, float]:
    """(its own CPU seconds, its reaped children's), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK, (int(fields[13]) + int(fields[14])) / TICK


def children(pid: int) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(proc.name))
            except OSError:
                pass
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=180.0)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--smi", help="a real nvidia-smi (default: the stand-in)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gpu-recorder-bench-"))
    socket = f"bench-recorder-{os.getpid()}"
    holders = []
    smi = args.smi
    if smi is None:
        holders = [subprocess.Popen(["sleep", str(args.seconds + 60)]) for _ in range(args.gpus)]
        procs = work / "procs.json"
        procs.write_text(json.dumps([{"pid": p.pid, "gpu": i, "used_mib": 60000, "name": "python3"} for i, p in enumerate(holders)]))
        smi = str(work / "nvidia-smi")
        Path(smi).write_text(
            f"#!/bin/sh\nFAKE_NVIDIA_SMI_GPUS={args.gpus} FAKE_NVIDIA_SMI_STATE=load FAKE_NVIDIA_SMI_PROCS={procs} "
            f'exec {sys.executable} -S {REPO}/tests/fake_nvidia_smi.py "$@"\n'
        )
        Path(smi).chmod(0o755)
    host = LocalHost(runs_root=str(work / "runs"))
    host.tmux_socket = socket
    try:
        assert asyncio.run(start.recorder(host, "start", smi)) == "started"
        pane = int(subprocess.run(["tmux", "-L", socket, "list-panes", "-t", f"={start.session_of(host.runs_root)}:", "-F", "#{pane_pid}"],
                                  capture_output=True, text=True, check=True).stdout)  # fmt: skip
        began = time.monotonic()
        time.sleep(args.seconds)
        seconds = time.monotonic() - began
        own, reaped = cpu(pane)
        loop = sum(sum(cpu(child)) for child in children(pane))
        files = {p.name: p.stat().st_size for p in (work / "runs" / "gpu").iterdir()}
    finally:
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True)
        for holder in holders:
            holder.kill()
    total = sum(files.values())
    print(json.dumps({
        "seconds": round(seconds, 1), "gpus": args.gpus, "smi": "stand-in" if args.smi is None else args.smi,
        "bytes": total, "bytes_per_day": round(total / seconds * 86400),
        "by_kind_per_day": {name.split(".")[1]: round(size / seconds * 86400) for name, size in sorted(files.items())},
        "recorder_cpu_s": own, "recorder_percent_of_one_core": round(100 * own / seconds, 2),
        "reaped_each_tick_cpu_s": reaped, "smi_loop_cpu_s": loop,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
