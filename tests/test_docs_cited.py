"""Code cites the docs by a heading that is there, and the current pages say what holds now:
docs/load.md the figures with their command, docs/load-archive.md the rounds that led there."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
CITING = ("tui", "backends", "training", "bench", "scripts", "tests")


def headings(page: Path) -> list[str]:
    return [line.lstrip("#").strip() for line in page.read_text().splitlines() if line.startswith("#")]


@pytest.mark.parametrize("folder", CITING)
def test_code_cites_a_heading_that_is_there(folder):
    wrong = []
    for path in (ROOT / folder).rglob("*.py"):
        text = re.sub(r"\s*\n\s*#?\s*", " ", path.read_text())  # a citation wrapped over comment lines
        for page, title in re.findall(r'docs/([\w-]+)\.md, "([^"]+)"', text):
            doc = DOCS / f"{page}.md"
            if not doc.exists() or not any(h.startswith(title) for h in headings(doc)):
                wrong.append((str(path.relative_to(ROOT)), page, title))
    assert wrong == []


@pytest.mark.parametrize("page", ["README.md", *sorted(p.name for p in DOCS.glob("*.md"))])
def test_the_docs_cite_a_heading_that_is_there(page):
    path = ROOT / page if page == "README.md" else DOCS / page
    text = re.sub(r"\s*\n\s*", " ", path.read_text())
    cited = re.findall(r'docs/([\w-]+)\.md\)?,? "([^"]+)"', text)  # docs/x.md "T", [docs/x.md](…) "T"
    assert [(p, t) for p, t in cited if not any(h.startswith(t) for h in headings(DOCS / f"{p}.md"))] == []


def test_the_load_page_holds_no_rounds():
    page = (DOCS / "load.md").read_text()
    assert not re.search(r"\brounds? \d", page, re.IGNORECASE)
    assert "tests/tui/load_bench.py" in page and "(load-archive.md)" in page
    assert (DOCS / "load-archive.md").exists()
