"""What scripts/ and bench/ run is not the test suite's: the screenshots' sample fleet, the
browser and the local stand-in for a GPU box live in packages both they and the tests
import (scripts/), so no script imports from tests/."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted(p for folder in ("scripts", "bench") for p in (ROOT / folder).glob("*.py"))


def imported(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_script_imports_nothing_from_tests(path):
    assert not [name for name in imported(path) if name == "tests" or name.startswith("tests.")]
