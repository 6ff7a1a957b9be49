"""docs/benchmarks.md keeps the current figures under headings code can cite, and
docs/benchmarks-archive.md the rounds that led to them; bench/results holds the records the
current page cites (and those they name), bench/results/archive the rest."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CURRENT = ROOT / "docs" / "benchmarks.md"
ARCHIVE = ROOT / "docs" / "benchmarks-archive.md"
RESULTS = ROOT / "bench" / "results"
# A result file as the pages name it: with or without its folder, a glob or a {a,b} choice
# standing for several, its extension left off where "and `.json`" follows.
NAMED = re.compile(r"(?<![\w-])(h200-[A-Za-z0-9_.{},*\-]*[A-Za-z0-9_*}])")
# The folders whose code must cite docs/benchmarks.md by heading, never by round.
CITING = ("tui", "backends", "training", "bench", "scripts", "tests")


def headings(page: Path) -> list[str]:
    return [line.lstrip("#").strip() for line in page.read_text().splitlines() if line.startswith("#")]


def choices(pattern: str) -> list[str]:
    brace = re.search(r"\{([^{}]*)\}", pattern)
    if not brace:
        return [pattern]
    return [x for alt in brace.group(1).split(",") for x in choices(pattern[: brace.start()] + alt + pattern[brace.end() :])]


def files_named(text: str, folder: Path) -> dict[str, set[str]]:
    """Each result-file pattern in `text`, with the files of `folder` it names."""
    files = [p.name for p in folder.iterdir() if p.is_file()]
    named = {}
    for pattern in set(NAMED.findall(text)):
        stems = [choice.split(".")[0] for choice in choices(pattern)]
        named[pattern] = {f for f in files for stem in stems if fnmatch.fnmatch(f.split(".")[0], stem)}
    return named


def test_the_current_page_names_no_round_or_session_in_its_headings():
    assert not [h for h in headings(CURRENT) if re.search(r"\b(round|session)s? \d", h, re.IGNORECASE)]


def test_the_operator_loop_keeps_its_heading():
    assert [h for h in headings(CURRENT) if h.startswith("The operator's loop")]


@pytest.mark.parametrize("page, folders", [(CURRENT, [RESULTS]), (ARCHIVE, [RESULTS, RESULTS / "archive"])])
def test_every_result_file_a_page_names_is_there(page, folders):
    found = [files_named(page.read_text(), folder) for folder in folders]
    assert not [pattern for pattern in found[0] if not any(f[pattern] for f in found)]


def test_bench_results_holds_what_the_current_page_cites_and_no_more():
    cited = set().union(*files_named(CURRENT.read_text(), RESULTS).values())
    while True:  # a record a cited record names stays beside it
        named = {
            name
            for record in cited
            for name in set().union(*files_named((RESULTS / record).read_text(errors="replace"), RESULTS).values())
        }
        if named <= cited:
            break
        cited |= named
    kept = {p.name for p in RESULTS.iterdir() if p.is_file()}
    assert sorted(kept - cited) == []


@pytest.mark.parametrize("folder", CITING)
def test_code_cites_a_heading_not_a_round(folder):
    # That the heading cited is there: tests/test_docs_cited.py, for every page.
    for path in (ROOT / folder).rglob("*.py"):
        text = re.sub(r"\s*\n\s*#?\s*", " ", path.read_text())  # a citation wrapped over comment lines
        assert not re.search(r"docs/benchmarks\.md,? rounds? \d", text), path


def test_the_readme_cites_headings_not_sessions():
    readme = (ROOT / "README.md").read_text()
    assert not re.search(r"\bsessions? \d", readme, re.IGNORECASE)
    current = headings(CURRENT)
    cited = re.findall(r'\[docs/benchmarks\.md\]\(docs/benchmarks\.md\)\s+"([^"]+)"', readme)
    assert cited and [title for title in cited if not any(h.startswith(title) for h in current)] == []
