"""bench/fresh_box.py on the CPU (--smoke): the tiny drafter launched three times, each
with its caches empty, and reported; the sets the tree ships moved aside meanwhile and put
back, when it ends, when a call's `timeout` stops it (SIGTERM), and at the next start after
it was killed outright. Run in a copy of the tree: the bench moves the package's folder."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from tests.waiting import HANG_S, until

REPO = Path(__file__).resolve().parents[2]
OURS = b"the tree's own set"


def tree(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of what the bench runs, with a set of its own in the package's folder."""
    root = tmp_path / "tree"
    for part in ("bench", "training"):
        shutil.copytree(REPO / part, root / part, ignore=shutil.ignore_patterns("__pycache__", "compiled"))
    shipped = root / "training" / "compiled" / "torch-x-sm90" / "0123456789abcdef.xz"
    shipped.parent.mkdir(parents=True)
    shipped.write_bytes(OURS)
    return root, shipped


def bench(root: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "bench/fresh_box.py", "--smoke", "--drafters", "eagle3"], cwd=root,
                            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root), "HOME": str(root)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip


def test_the_smoke_run_reports_each_launch_and_puts_the_trees_sets_back(tmp_path):
    root, shipped = tree(tmp_path)
    out, err = (run := bench(root)).communicate(timeout=900)
    assert run.returncode == 0, err[-2000:]
    report = json.loads(out[out.rindex('{\n "eagle3"'):])
    for launch in ("cold", "with_artifacts", "with_artifacts_and_triton_cache"):
        assert 0 < report["eagle3"][launch]["start_event_s"] < report["eagle3"][launch]["first_step_s"]
    assert shipped.read_bytes() == OURS and sorted((root / "training" / "compiled").rglob("*")) == [shipped.parent, shipped]
    assert not (root / "training" / ".compiled-aside").exists()


def test_stopped_by_sigterm_or_killed_outright_the_trees_sets_come_back(tmp_path):
    root, shipped = tree(tmp_path)
    aside = root / "training" / ".compiled-aside"
    run = bench(root)
    until(aside.exists, HANG_S, "the sets moved aside")
    run.send_signal(signal.SIGTERM)
    run.communicate(timeout=HANG_S)
    assert shipped.read_bytes() == OURS and not aside.exists()
    # killed outright, nothing puts them back then: the next start does
    run = bench(root)
    until(aside.exists, HANG_S, "the sets moved aside")
    run.kill()
    run.communicate(timeout=HANG_S)
    assert aside.exists() and not shipped.exists()
    made = root / "training" / "compiled" / "bench-made" / "fedcba9876543210.xz"  # a cold launch's, copied in
    made.parent.mkdir(parents=True)
    made.write_bytes(b"the bench's")
    run = bench(root)
    until(lambda: not made.exists() or run.poll() is not None, HANG_S, "the next start")
    run.send_signal(signal.SIGTERM)
    _, err = run.communicate(timeout=HANG_S)
    assert shipped.read_bytes() == OURS and not aside.exists() and not made.parent.exists(), err[-2000:]
