"""The dashboard's state changes one way: through a transition of the Store (tui/store.py).
A module that wrote a store field itself (`app.pending[key] = ...`, `stopped_runs.add`)
changed the state behind the reducer's back, where no test of the store sees it.

Read in the syntax tree: every assignment, deletion and mutating call whose target goes
through one of the store's fields (`store.pending[k]`, `app.runs[k].info`, `self.kill_alerts`),
in every module of tui/ and of the tests but tui/store.py. `self.runs = runs` binds an
object's own field (a message's, a screen's), which is no write through the store.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STORE = ROOT / "tui" / "store.py"

# What changes a dict, a set, a list in place, and the alert book's own changes.
MUTATORS = {"add", "discard", "pop", "popitem", "setdefault", "update", "clear", "append", "extend", "remove", "insert",
            "stopped", "stop_failed", "evaluate"}  # fmt: skip


def store_fields() -> set[str]:
    """The fields Store.__init__ sets: read from its source, so a new field is covered."""
    tree = ast.parse(STORE.read_text(encoding="utf-8"))
    [store] = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Store"]
    [init] = [node for node in store.body if isinstance(node, ast.FunctionDef) and node.name == "__init__"]
    return {
        target.attr
        for node in ast.walk(init) if isinstance(node, (ast.Assign, ast.AnnAssign))
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self"
    }  # fmt: skip


def through_field(node: ast.expr, fields: set[str]) -> str | None:
    """The store field that an attribute or subscript chain goes through, if any."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        if isinstance(node, ast.Attribute) and node.attr in fields:
            return node.attr
        node = node.value
    return None


def is_own_attribute(node: ast.expr) -> bool:
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"


def writes(tree: ast.AST, fields: set[str]) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
            targets = [node.func.value]
        else:
            continue
        for target in targets:
            for part in target.elts if isinstance(target, ast.Tuple) else [target]:
                if is_own_attribute(part) and not isinstance(node, ast.Call):
                    continue  # `self.runs = runs`: another object's field of the same name, bound
                if (field := through_field(part, fields)) is not None:
                    found.append((node.lineno, field))
    return sorted(found)


def modules() -> list[Path]:
    return [path for folder in ("tui", "tests") for path in sorted((ROOT / folder).rglob("*.py")) if path != STORE]


def test_the_store_has_the_fields_this_check_reads():
    assert {"hosts", "runs", "pending", "selected", "kill_alerts", "stopped_runs", "alerts"} <= store_fields()


def test_no_module_but_the_store_writes_a_store_field():
    fields = store_fields()
    found = [
        f"{path.relative_to(ROOT)}:{line}: writes {field}"
        for path in modules() for line, field in writes(ast.parse(path.read_text(encoding="utf-8")), fields)
    ]  # fmt: skip
    assert found == [], "\n".join(found)


def test_the_check_sees_each_way_of_writing():
    fields = store_fields()
    code = ("app.pending[k] = 1\nself.stopped_runs.add(k)\ndel app.runs[k]\napp.store.runs[k].info = i\nx.alert_book.stopped(k)\n"
            "self.kill_alerts[k] = a\nself.runs = runs\n")
    assert [line for line, _ in writes(ast.parse(code), fields)] == [1, 2, 3, 4, 5, 6]
