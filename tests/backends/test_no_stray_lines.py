"""No stray lines on stderr: a host command that ends as it is read to its end is not
reaped twice (asyncio's child watcher would log "Unknown child process pid N, will report
returncode 255"), neither in the host's own loop nor through the commands that use it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.backends.test_runs import PY, tmux_dir  # noqa: F401 (fixture)

REPO = Path(__file__).resolve().parents[2]
TRACKSIDE = str(REPO / ".venv" / "bin" / "trackside")
STRAY = "Unknown child process"

# Many short host commands, each read to its end as it exits (the race: whoever kills it
# after its end must not reap it ahead of the watcher), and some cut short by a timeout.
CYCLES = """
import asyncio, contextlib, sys, time
from backends.hosts import HostError, LocalHost

async def main():
    host, until, cycles = LocalHost(), time.monotonic() + float(sys.argv[1]), 0
    while time.monotonic() < until:
        async with contextlib.aclosing(host.chunks(["sh", "-c", "echo x"])) as chunks:
            async for _ in chunks:
                pass
        assert (await host.run(["true"])).returncode == 0
        if cycles % 50 == 0:
            with contextlib.suppress(HostError):
                await host.run(["sleep", "5"], timeout=0.01)
        cycles += 1
    print(cycles)

asyncio.run(main())
"""

# A run that logs steps for a while, as a trainer in tmux does.
STEPS = "import time\nfor n in range(1, 2000):\n    print(f'step {n} loss 2.0', flush=True)\n    time.sleep(0.05)"


def test_short_host_commands_read_to_their_end_leave_stderr_empty():
    done = subprocess.run([PY, "-c", CYCLES, "4"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0 and int(done.stdout) > 0, done.stderr
    assert done.stderr == ""


@pytest.mark.slow  # 20 s of commands against a real tmux run
def test_runs_watch_plot_and_kill_print_no_stray_line(tmp_path, tmux_dir):  # noqa: F811 (fixture)
    root = tmp_path / "runs"
    root.mkdir()
    config = tmp_path / "config.toml"
    config.write_text(f"[hosts.box]\nruns_root = {json.dumps(str(root))}\n")
    flags = ["--config", str(config)]

    def trackside(*argv: str) -> subprocess.CompletedProcess:
        done = subprocess.run([TRACKSIDE, *argv], capture_output=True, text=True, cwd=tmp_path, timeout=120)
        assert STRAY not in done.stderr and "Traceback" not in done.stderr, (argv, done.stderr)
        return done

    launched = trackside("launch", *flags, "--json", "--", PY, "-c", STEPS)
    assert launched.returncode == 0, launched.stderr
    run_id = json.loads(launched.stdout)["run_id"]
    # Each command reads the run's pane many times over; a few rounds, bounded in time,
    # so that a race lost once in a few hundred reads shows.
    until = time.monotonic() + 20
    while time.monotonic() < until:
        runs = trackside("runs", *flags)
        assert runs.returncode == 0 and runs.stderr == "" and run_id in runs.stdout, runs.stderr
        watched = trackside("watch", "--once", *flags)
        assert watched.returncode in (0, 1) and watched.stderr == "", watched.stderr
        trackside("plot", run_id, *flags, "--width", "60", "--height", "10")
    killed = trackside("kill", run_id, *flags, "--grace", "2")
    assert killed.returncode == 0, killed.stderr
    assert killed.stderr == ""
