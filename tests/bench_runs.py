"""How a test runs a bench script: as a device call does, from the repository's root with
$OUT set, and on the CPU (each bench's --smoke or tiny flags)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_bench(script: str, *args: str, out: Path, timeout: float, env: dict | None = None) -> str:
    """bench/SCRIPT with args, its files written under out; its stdout. Fails the test on
    a non-zero exit, with the end of its stderr."""
    done = subprocess.run([sys.executable, f"bench/{script}", *args], cwd=REPO,
                          env={**os.environ, "OUT": str(out), **(env or {})},
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout
