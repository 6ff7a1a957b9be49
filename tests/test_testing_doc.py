"""docs/testing.md says how to run the suite and what takes time: every marker the suite
registers, the monkeys' defaults as the tests have them, and no diary of sessions; the
README points here for the suite's time instead of restating it."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = (ROOT / "docs" / "testing.md").read_text()


def test_every_registered_marker_is_explained():
    markers = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    assert [m.split(":")[0] for m in markers if f"`{m.split(':')[0]}`" not in DOC] == []


def test_the_monkeys_defaults_are_the_tests_own():
    monkey = (ROOT / "tests" / "tui" / "test_monkey.py").read_text()
    for name, default in re.findall(r'os\.environ\.get\("(TRACKSIDE_MONKEY_\w*KEYS)", (\d+)\)', monkey):
        assert re.search(rf"`{name}`[^`]*default {int(default):,}", DOC), name


def test_it_is_not_a_diary():
    assert not re.search(r"\bsessions? \d", DOC, re.IGNORECASE)


def test_the_readme_points_here_for_the_suites_time():
    readme = (ROOT / "README.md").read_text()
    testing = readme[readme.index("\n## Testing") : readme.index("\n## ", readme.index("\n## Testing") + 1)]
    assert "(docs/testing.md)" in testing
    assert not re.search(r"\b\d+ ?(min|minutes)\b", testing)  # the figures are this page's alone
