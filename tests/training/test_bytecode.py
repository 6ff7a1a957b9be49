"""The trainer keeps its imports' bytecode where the environment turned bytecode off
(PYTHONDONTWRITEBYTECODE=1, as some GPU images set it): a later launch reads it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
IMPORT = "import sys; from training.bytecode import keep_bytecode; print(keep_bytecode()); import somemodule"


def run(tmp_path: Path, **env: str) -> str:
    modules = tmp_path / "modules"
    modules.mkdir(exist_ok=True)
    (modules / "somemodule.py").write_text("X = 1\n")
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
    environ.update(PYTHONPATH=f"{REPO}:{modules}", TRACKSIDE_PYCACHE=str(tmp_path / "cache"), **env)
    return subprocess.run([sys.executable, "-c", IMPORT], env=environ, capture_output=True, text=True, check=True).stdout.strip()


def test_bytecode_turned_off_by_the_environment_is_kept_under_the_cache(tmp_path):
    assert run(tmp_path, PYTHONDONTWRITEBYTECODE="1") == str(tmp_path / "cache")
    kept = list((tmp_path / "cache").rglob("somemodule*.pyc"))
    assert len(kept) == 1 and not (tmp_path / "modules" / "__pycache__").exists()


def test_where_bytecode_is_allowed_nothing_changes(tmp_path):
    assert run(tmp_path) == "None"
    assert not (tmp_path / "cache").exists() and list((tmp_path / "modules" / "__pycache__").glob("*.pyc"))


def test_the_trainers_entry_keeps_what_it_imports_after_it_starts(tmp_path):
    """`trackside fit` imports training.fit once the command is known, as `train` imports
    torch: its bytecode is kept under the cache when the environment turned bytecode off."""
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONPYCACHEPREFIX",)}
    environ.update(PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="1", TRACKSIDE_PYCACHE=str(tmp_path / "cache"))
    subprocess.run([sys.executable, "-m", "training", "fit", "--help"], env=environ, capture_output=True, check=True)
    assert list((tmp_path / "cache").rglob("training/fit.*.pyc"))
