"""Each default and each name the code relies on is written once in tui/ and backends/:
a second copy is a value that can drift from the first (a kill whose grace the config says
is 30 s while the watcher waits another), so every other place reads the one.

Only code counts: comments and docstrings may quote a value to explain it.
"""

from __future__ import annotations

import ast
import dataclasses
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# What is written once, and a pattern for a line of code that writes it.
FACTS = {
    "the kill's grace period between SIGTERM and SIGKILL, 30 s": r"(?i)grace\w*\W.*\b30(\.0)?\b",
    "the trainer's command, trackside train": r"""["']trackside["'],\s*["']train["']""",
    "an SSH host's channels at once, 8": r"(?i)max_channels\W.*\b8\b",
    "a launched run's tmux session name, ts-<run id>": r"""["']ts-""",
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
    return [path for package in ("tui", "backends") for path in sorted((ROOT / package).rglob("*.py"))]


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


# Facts checked by value and meaning, in the syntax tree, not by a spelling: each finds
# where code other than the fact's home writes the fact's value where it means that fact.


def trees() -> list[tuple[str, ast.Module]]:
    return [(str(path.relative_to(ROOT)), ast.parse(path.read_text(encoding="utf-8"))) for path in sources()]


def number(node: ast.AST) -> float | None:
    ok = isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
    return node.value if ok else None


def words(node: ast.AST) -> set[str]:
    """The string constants a comparison compares with: one, or a tuple's, list's or set's."""
    parts = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return {p.value for p in parts if isinstance(p, ast.Constant) and isinstance(p.value, str)}


def underfed_fractions(tree: ast.Module) -> list[int]:
    """A number multiplying or dividing a reading's power limit: a fraction of it (0.5 or
    `/ 2` alike) is the under-fed threshold restated."""
    from backends.gpu import GpuReading

    limit = "power_limit_w"
    assert limit in {f.name for f in dataclasses.fields(GpuReading)}
    return [
        node.lineno for node in ast.walk(tree)
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Div))
        and any(isinstance(side, ast.Attribute) and side.attr == limit for side in (node.left, node.right))
        and any(number(side) is not None for side in (node.left, node.right))
    ]  # fmt: skip


def poll_periods(tree: ast.Module) -> list[int]:
    """A poll or interval (a parameter's default, an assignment, a keyword argument) given
    the poll's value as a number, in its name's unit: 1000 for `…_ms`, else 1 (seconds).
    The home is backends/config.py's Defaults.poll_ms."""
    from backends import config

    home = config.Defaults.poll_ms
    found = []

    def check(name: str | None, value: ast.AST, line: int) -> None:
        if not name or not any(word in name.lower() for word in ("poll", "interval")):
            return
        values = [value.body, value.orelse] if isinstance(value, ast.IfExp) else [value]
        want = home if name.lower().endswith("ms") else home / 1000
        if any(number(v) == want for v in values):
            found.append(line)

    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            positional = args.posonlyargs + args.args
            for arg, default in zip(positional[len(positional) - len(args.defaults):], args.defaults):
                check(arg.arg, default, default.lineno)
            for arg, default in zip(args.kwonlyargs, args.kw_defaults):
                if default is not None:
                    check(arg.arg, default, default.lineno)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                check(getattr(target, "id", None) or getattr(target, "attr", None), node.value, node.lineno)
        elif isinstance(node, ast.keyword):
            check(node.arg, node.value, node.value.lineno)
    homes = [
        item.lineno for node in ast.walk(tree) if isinstance(node, ast.ClassDef) and node.name == "Defaults"
        for item in node.body if isinstance(item, ast.AnnAssign) and getattr(item.target, "id", "") == "poll_ms"
    ]  # fmt: skip
    return [line for line in found if line not in homes]


def event_words(tree: ast.Module) -> list[int]:
    """A string compared with an event's `event` field, or an end status's word (the
    contract's, training/contract.py) compared with anything."""
    from training import contract

    ends = {contract.COMPLETED, contract.STOPPED, contract.FAILED, contract.ENDED_OOM, contract.ENDED_NONFINITE}

    def reads_event(node: ast.AST) -> bool:
        key = node.slice if isinstance(node, ast.Subscript) else None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" and node.args:
            key = node.args[0]
        return isinstance(key, ast.Constant) and key.value == "event"

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            said = set().union(*(words(side) for side in sides))
            if said & ends or (said and any(reads_event(side) for side in sides)):
                found.append(node.lineno)
        elif isinstance(node, ast.MatchValue) and words(node.value) & ends:
            found.append(node.lineno)
    return found


def host_status_words(tree: ast.Module) -> list[int]:
    """A host status's word (tui.state.HostStatus) written as a string: returned, compared
    with a `status`, or given to HostFailed."""
    from tui.state import HostStatus

    statuses = {s.value for s in HostStatus}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Return) and node.value is not None and words(node.value) & statuses:
            found.append(node.lineno)
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(isinstance(s, ast.Attribute) and s.attr == "status" for s in sides) and set().union(*map(words, sides)) & statuses:
                found.append(node.lineno)
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "HostFailed":
            if set().union(*map(words, [*node.args, *(k.value for k in node.keywords)])) & statuses:
                found.append(node.lineno)
    return found


MEANT = {
    "the under-fed fraction of the power limit": underfed_fractions,
    "the dashboard's poll period": poll_periods,
    "an event's or an end status's word": event_words,
    "a host's status word": host_status_words,
}


@pytest.mark.parametrize("fact", MEANT)
def test_a_fact_is_written_only_in_its_home(fact):
    found = {path: lines for path, tree in trees() if (lines := MEANT[fact](tree))}
    assert found == {}, f"{fact} restated outside its home"


def test_a_failed_poll_reads_as_a_host_status():
    from backends.hosts import AuthFailed, HostError, HostUnreachable
    from tui.monitor import failure_status
    from tui.state import HostStatus

    errors = {HostStatus.AUTH: AuthFailed("box", "refused"), HostStatus.OFFLINE: HostUnreachable("box", "down"),
              HostStatus.ERROR: HostError("box", "odd")}  # fmt: skip
    for status, error in [*errors.items(), (HostStatus.OFFLINE, TimeoutError()), (HostStatus.ERROR, ValueError())]:
        said = failure_status(error)[0]
        assert type(said) is HostStatus and said is status, (error, said)
