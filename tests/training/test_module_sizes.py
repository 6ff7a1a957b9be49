"""No module of the trainer past ~400 lines: past that, a module is holding more than one
concept (docs/design.md names any that must, with why)."""

from __future__ import annotations

from pathlib import Path

TRAINING = Path(__file__).resolve().parents[2] / "training"
LIMIT = 400


def test_no_training_module_is_past_the_limit():
    lines = {str(path.relative_to(TRAINING)): len(path.read_text(encoding="utf-8").splitlines())
             for path in TRAINING.rglob("*.py")}
    assert {name: n for name, n in lines.items() if n > LIMIT} == {}
