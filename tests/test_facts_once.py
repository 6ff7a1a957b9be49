"""Each default and each name the code relies on is written once in tui/ and backends/:
a second copy is a value that can drift from the first (a kill whose grace the config says
is 30 s while the watcher waits another), so every other place reads the one.

Only code counts: comments and docstrings may quote a value to explain it.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Sample data: tui/sample.py writes a made-up fleet as a listing shows it, its runs'
# session names included. Those are what a listing reads back, not a name it makes; the
# sample is not the code that makes one.
SAMPLE_DATA = {"tui/sample.py"}

# What is written once, and a pattern for a line of code that writes it.
FACTS = {
    "the kill's grace period between SIGTERM and SIGKILL, 30 s": r"(?i)grace\w*\W.*\b30(\.0)?\b",
    "the trainer's command, trackside train": r"""["']trackside["'],\s*["']train["']""",
    "an SSH host's channels at once, 8": r"(?i)max_channels\W.*\b8\b",
    "a launched run's tmux session name, ts-<run id>": r"""["']ts-""",
    "the dashboard's poll period, 1000 ms": r"(?i)poll_ms\W[^/]*\b1000\b",  # not a conversion (/ 1000)
    "the interpreter of shipped code, python3": r"""["']python3["']""",
}


def code_lines(path: Path) -> list[tuple[int, str]]:
    """The file's lines of code: comments and docstrings blanked out."""
    source = path.read_text(encoding="utf-8")
    docstrings = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            docstrings.update(range(body[0].lineno, body[0].end_lineno + 1))
    lines = source.splitlines()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            row, col = token.start
            lines[row - 1] = lines[row - 1][:col]
    return [(n, line) for n, line in enumerate(lines, 1) if n not in docstrings]


def sources() -> list[Path]:
    return [
        path for package in ("tui", "backends") for path in sorted((ROOT / package).rglob("*.py"))
        if str(path.relative_to(ROOT)) not in SAMPLE_DATA
    ]  # fmt: skip


@pytest.mark.parametrize("fact", FACTS)
def test_each_fact_is_written_once(fact):
    pattern = re.compile(FACTS[fact])
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in sources() for n, line in code_lines(path) if pattern.search(line)
    ]  # fmt: skip
    assert len(found) == 1, "\n".join(found)


def test_the_configs_schema_checks_and_its_dataclasses_hold_the_defaults():
    """backends/config.py: a setting's check in the schema, its built-in value on the
    dataclass field alone, and a file that sets nothing gets those values."""
    from backends import config

    for table in (config.DEFAULTS_SCHEMA, config.HOST_SCHEMA):
        assert all(callable(check) for check in table.values()), table
    parsed = config.parse_config({})
    assert parsed.defaults == config.Defaults(runs_root=parsed.defaults.runs_root)
    written = config.parse_config({"hosts": {"box": {"address": "10.0.0.5"}}}).hosts[0]
    assert written == config.HostConfig("box", address="10.0.0.5")
