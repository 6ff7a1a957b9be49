"""No module of the dashboard past ~400 lines: past that, a module is holding more than
one concept (docs/design.md names any that must, with why)."""

from __future__ import annotations

from pathlib import Path

TUI = Path(__file__).resolve().parents[2] / "tui"
LIMIT = 400


def test_no_tui_module_is_past_the_limit():
    lines = {str(path.relative_to(TUI)): len(path.read_text(encoding="utf-8").splitlines()) for path in TUI.rglob("*.py")}
    assert {name: n for name, n in lines.items() if n > LIMIT} == {}
