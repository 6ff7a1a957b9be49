"""What hostile pane text costs: the sanitizer's and the line terminal's speed
(backends/sanitize.py, backends/logs/screen.py), `trackside runs` with one 20 KB line in a real
pane against without it, and the dashboard's RSS after 90 MB of output with no newline in
a run it follows.

    python3 bench/hostile_text.py [--part speed|runs|rss|all]

Runs on this machine's tmux, on a private server (TMUX_TMPDIR), under a temporary runs
root; prints one JSON line per part.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from backends import sanitize  # noqa: E402
from backends.logs import screen

PY = sys.executable
BAR = " 45%|████▌     | 45/100 [00:10<00:12,  4.50it/s, loss=2.31]\r"
TEXTS = {
    # A trainer's recording: a tqdm bar redrawn 20 times between coloured log lines.
    "recording": (BAR * 20 + "step 10 \x1b[32mloss\x1b[0m 2.3 lr 1e-4\r\n") * 4000,
    "plain": ("x" * 79 + "\n") * 40000,
    # Every other character a control or the start of a sequence.
    "hostile": ("a\x1b[D\x1b]0;t\x07\x9b2J\x1bc\x08" * 100000),
}


def speed() -> dict:
    out = {}
    for name, text in TEXTS.items():
        size = len(text.encode())
        for what, run in (("sanitizer", sanitize.clean), ("terminal", lambda t: screen.Terminal().feed(t))):
            times = []
            for _ in range(3):  # CPU seconds: on a shared machine, wall time counts the others' work
                started = time.process_time()
                run(text)
                times.append(time.process_time() - started)
            out[f"{what}_{name}_MB_per_s"] = round(size / min(times) / 1e6, 1)
    return out


def _tmux(*argv: str) -> None:
    subprocess.run(["tmux", *argv], check=True)


def _trackside(config: str, command: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "tui.cli", command, "--config", config, *argv], capture_output=True, text=True, cwd=REPO, check=True)


def _session(tmp: Path, config: str, name: str, text: str) -> None:
    """A session that prints `text` once trackside records it, then idles."""
    printed, go = tmp / f"{name}.txt", tmp / f"{name}.go"
    printed.write_text(text)
    wait = 'while [ ! -e "$2" ]; do sleep 0.05; done; cat "$1"; sleep 3600'
    _tmux("new-session", "-d", "-s", name, "-x", "200", "-y", "50", "sh", "-c", wait, "sh", str(printed), str(go))
    _trackside(config, "runs")  # starts its recording
    go.touch()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        listed = json.loads(_trackside(config, "runs", "--json").stdout)
        if any(r["session"] == name and r["last_step"] == 199 for r in listed):
            return
    raise RuntimeError(f"{name}'s steps never read")


def _timed_runs(config: str, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        _trackside(config, "runs")
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def runs_with_a_long_line(tmp: Path, config: str) -> dict:
    """Median wall time of `trackside runs` over 5, a session's pane recorded, before and
    after it prints one 20 KB line: the line a backtracking regex once spent 40 s on
    (`loss ` and 10,000 `%|`), then a plain one."""
    lines = "".join(f"step={i} loss={2 - i / 1000:.4f} lr=1e-4\n" for i in range(200))
    _session(tmp, config, "plain", lines)
    before = _timed_runs(config)
    _tmux("kill-session", "-t", "plain")
    _session(tmp, config, "long", "loss " + "%|" * 10_000 + "\n" + "y" * 20_000 + "\n" + lines)
    after = _timed_runs(config)
    return {"runs_s_without": round(before, 2), "runs_s_with_20KB_lines": round(after, 2), "ratio": round(after / before, 2)}


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def _python_under(pid: int) -> int:
    """The dashboard's process: the pane's own, or the python its shell started."""
    for _ in range(100):
        if "python" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
            return pid
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        if children:
            pid = int(children[0])
        else:
            time.sleep(0.1)
    raise RuntimeError("no dashboard process")


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").iterdir():
            children = [int(c) for c in (task / "children").read_text().split()]
            found += children
            todo += children
    return found


def _followed_to(dashboard: int, log: Path) -> int:
    """How far the dashboard's follower (its `tail -F` of console.log) has read: within a
    pipe's 64 KiB of what the dashboard has taken."""
    for pid in _descendants(dashboard):
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                if fd.resolve() == log.resolve():
                    return int(Path(f"/proc/{pid}/fdinfo/{fd.name}").read_text().split()[1])
        except OSError:
            continue
    return 0


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def dashboard_rss(tmp: Path, config: str, runs_root: str) -> dict:
    """The dashboard in a tmux pane of its own, a run launched beside it printing 90 MB
    with no newline (its console.log followed, its pane's output folded at each listing):
    the dashboard's RSS before the output, its peak until its follower has read it all,
    and 30 s after."""
    _tmux("new-session", "-d", "-s", "dash", "-x", "160", "-y", "48", PY, "-m", "tui.cli", "--config", config)
    pane = int(subprocess.run(["tmux", "display", "-p", "-t", "dash", "#{pane_pid}"], capture_output=True, text=True, check=True).stdout)
    dashboard = _python_under(pane)
    time.sleep(15)  # started, the fleet drawn
    idle = _rss_mib(dashboard)
    flood = "sleep 5; head -c 94371840 /dev/zero | tr '\\0' x; sleep 3600"  # 90 MiB, no newline
    _trackside(config, "launch", "--", "sh", "-c", flood)
    log = next(Path(runs_root).glob("*/console.log"), None)
    started, peak = time.monotonic(), idle
    while (log is None or log.stat().st_size < 94371840) and time.monotonic() - started < 900:
        time.sleep(1)
        peak = max(peak, _rss_mib(dashboard))
        log = log or next(Path(runs_root).glob("*/console.log"), None)
    flooded_s = time.monotonic() - started
    while log and _followed_to(dashboard, log) < log.stat().st_size and time.monotonic() - started < 900:
        time.sleep(1)
        peak = max(peak, _rss_mib(dashboard))
    read_s = time.monotonic() - started
    for _ in range(30):
        time.sleep(1)
        peak = max(peak, _rss_mib(dashboard))
    for run in json.loads(_trackside(config, "runs", "--json").stdout):
        if run["run_id"]:  # its pane's shell outlives the tmux server (it ignores SIGHUP)
            _trackside(config, "kill", run["run_id"])
    return {
        "console_log_bytes": log.stat().st_size if log else 0, "followed_bytes": _followed_to(dashboard, log) if log else 0,
        "written_s": round(flooded_s), "read_s": round(read_s), "dashboard_cpu_s": round(_cpu_s(dashboard), 1),
        "rss_mib_idle": round(idle), "rss_mib_peak": round(peak), "rss_mib_30s_after": round(_rss_mib(dashboard)),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("speed", "runs", "rss", "all"), default="all")
    args = parser.parse_args()
    if args.part in ("speed", "all"):
        print(json.dumps(speed()), flush=True)
    if args.part == "speed":
        return
    with tempfile.TemporaryDirectory(prefix="ts-hostile-", dir="/tmp") as tmp:
        os.environ["TMUX_TMPDIR"] = tmp
        os.environ.pop("TMUX", None)
        runs_root = Path(tmp) / "runs"
        runs_root.mkdir()
        config = Path(tmp) / "config.toml"
        config.write_text(f"[hosts.box]\nruns_root = {json.dumps(str(runs_root))}\n")
        try:
            if args.part in ("runs", "all"):
                print(json.dumps(runs_with_a_long_line(Path(tmp), str(config))), flush=True)
                subprocess.run(["tmux", "kill-server"], capture_output=True)
            if args.part in ("rss", "all"):
                print(json.dumps(dashboard_rss(Path(tmp), str(config), str(runs_root))), flush=True)
        finally:
            subprocess.run(["tmux", "kill-server"], capture_output=True)


if __name__ == "__main__":
    main()
