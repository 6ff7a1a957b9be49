"""Each fact of the trainer's parameters is written once in the product (training/,
backends/, tui/): the DFlash anchor rule and the drafters' defaults live on the parameter
table (training/params.py), and every other place reads them there. Not counted:
scripts/sample.py's sample runs, and bench/'s cells, which pin the configuration they measure
(512 anchors is the DFlash cell's, as much as its 8,192 tokens). A second copy is a value that can drift from the first
(`trackside fit` predicting for 512 anchors while the trainer draws 1,024).

Only code counts: comments and docstrings may quote a value to explain it. A statement is
read whole, whatever lines it spans, so a default in a help text split over two lines is
found too.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CODE = ("training", "backends", "tui")

# What is written once, and a pattern for a statement that writes it.
FACTS = {
    "the anchors a DFlash row holds, max_seq_len - block_size + 1":
        r"-\s*[\w.]*(?:block\w*|\bbs)\s*\+\s*1\b",
    "DFlash's anchors a row by default, 512": r"(?i)(?<!table_)anchors\b.*\b512\b",
    "DFlash's gamma by default, 7": r"(?i)gamma\b.*\b7(?:\.0)?\b",
    "EAGLE-3's TTT steps by default, 3": r"(?i)ttt_steps\b.*=\s*3\b",
    "EAGLE-3's TTT decay by default, 0.8": r"(?i)decay\b.*\b0\.8\b",
}


def statements(path: Path) -> list[tuple[int, str]]:
    """The file's statements (first line, text), comments and docstrings left out."""
    source = path.read_text(encoding="utf-8")
    docstrings = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant):
            docstrings.add(body[0].lineno)
    found, parts, first = [], [], None
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in (tokenize.COMMENT, tokenize.NL, tokenize.INDENT, tokenize.DEDENT,
                          tokenize.ENDMARKER):
            continue
        if token.type == tokenize.NEWLINE:
            if first not in docstrings:
                found.append((first, " ".join(parts)))
            parts, first = [], None
            continue
        first = token.start[0] if first is None else first
        parts.append(token.string)
    return found


def writings(pattern: str) -> list[str]:
    compiled = re.compile(pattern)
    return [f"{path.relative_to(ROOT)}:{line}: {text}"
            for package in CODE for path in sorted((ROOT / package).rglob("*.py"))
            for line, text in statements(path) if compiled.search(text)]


def test_statements_are_read_whole_without_comments_or_docstrings(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('"""max_anchors 512."""\nx = f(1,\n      512)  # anchors 512\n')
    assert statements(module) == [(2, "x = f ( 1 , 512 )")]


@pytest.mark.parametrize("fact", FACTS)
def test_each_fact_is_written_once(fact):
    found = writings(FACTS[fact])
    assert len(found) == 1, f"{fact}: written {len(found)} times:\n" + "\n".join(found)
