"""docs/design.md is the map of the code: every path it names is there, and every module of
tui/, backends/ and training/ is on it (by name, or in a folder below the top one that the map
names whole, none of its modules by name), so a module moved or added without the map fails
here, not in a newcomer's hands."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = (ROOT / "docs" / "design.md").read_text()
PACKAGES = ("tui", "backends", "training")
# A backticked path as the map writes one: from the repository root, a folder ending in "/";
# a bare file name is in the folder named last before it on its line (`tui/widgets/` (`footer.py`)).
PATH = re.compile(r"`([\w.-]+(?:/[\w.-]+)*/?)`")
FILE = re.compile(r"\.(py|md|toml|sh|tcss)$")


def named() -> set[str]:
    paths = set()
    for line in DOC.splitlines():
        folder = ""
        for p in PATH.findall(line):
            if p.endswith("/"):
                folder = p
            if "/" in p:
                paths.add(p)
            elif FILE.search(p):
                paths.add(folder + p)
    return paths


def test_every_path_it_names_exists():
    assert sorted(p for p in named() if not (ROOT / p).exists()) == []


def test_every_module_is_on_the_map():
    on_map = named()
    folders = {  # named whole: below a top package, none of its modules named
        p for p in on_map if p.endswith("/") and p.count("/") > 1 and not any(m.startswith(p) for m in on_map - {p})
    }  # fmt: skip
    modules = sorted(str(p.relative_to(ROOT)) for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))
    missing = [
        m for m in modules
        if m not in on_map and not any(m.startswith(folder) for folder in folders)
        and not (m.endswith("/__init__.py") and m.removesuffix("__init__.py") in on_map)
    ]  # fmt: skip
    assert missing == []
