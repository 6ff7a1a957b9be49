"""No module of the dashboard or of backends past ~400 lines: past that, a module is
holding more than one concept (docs/design.md names any that must, with why)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 400


@pytest.mark.parametrize("package", ["tui", "backends"])
def test_no_module_is_past_the_limit(package):
    top = ROOT / package
    lines = {str(path.relative_to(ROOT)): len(path.read_text(encoding="utf-8").splitlines()) for path in top.rglob("*.py")}
    assert {name: n for name, n in lines.items() if n > LIMIT} == {}
