"""Each contract value has one home, training/contract.py: no exit code or run-id format
written out anywhere else in tui/, backends/ or training/, and one usage error (exit 2).

Exit codes are looked for where they are used as such: `sys.exit(N)` and its kin, `return
N` from a command's `main` (or `*_main`), and an exit status compared with N. The run-id
format is looked for as its strftime pattern and as its regular expression.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from training import contract

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("tui", "backends", "training")
HOME = "training/contract.py"

EXIT_CODES = {contract.EXIT_OK, contract.EXIT_FAILURE, contract.EXIT_USAGE, contract.EXIT_OOM}
EXIT_CALLS = {"exit", "_exit", "SystemExit"}  # sys.exit, os._exit, exit(), raise SystemExit
# Names an exit status goes by where it is compared. 0 compared with a command's status
# means "it worked" for any program, so only our own codes (1, 2, 3) count there.
STATUS_NAMES = {"exit_status", "exit_code", "returncode", "status", "code"}
RUN_ID_SPELLINGS = (contract.RUN_ID_TIME_FORMAT, contract.RUN_ID.pattern)


def _name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _int(node: ast.AST | None) -> int | None:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    return None


def strays(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    mains = [
        f for f in ast.walk(tree)
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and (f.name == "main" or f.name.endswith("_main"))
    ]  # fmt: skip
    for main in mains:
        for node in ast.walk(main):
            if isinstance(node, ast.Return) and _int(node.value) in EXIT_CODES:
                found.append((node.lineno, f"return {node.value.value} from {main.name}"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _name(node.func) in EXIT_CALLS and node.args and _int(node.args[0]) in EXIT_CODES:
            found.append((node.lineno, f"{_name(node.func)}({node.args[0].value})"))
        elif isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], (ast.Eq, ast.NotEq)):
            left, right = node.left, node.comparators[0]
            for name, value in ((_name(left), _int(right)), (_name(right), _int(left))):
                if name in STATUS_NAMES and value in EXIT_CODES - {contract.EXIT_OK}:
                    found.append((node.lineno, f"{name} compared with {value}"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            for spelling in RUN_ID_SPELLINGS:
                if spelling in node.value:
                    found.append((node.lineno, f"the run-id format {spelling!r}"))
    return found


def _sources() -> list[Path]:
    return sorted(p for layer in LAYERS for p in (ROOT / layer).rglob("*.py"))


def test_no_contract_value_is_spelled_out_outside_its_home():
    stray = []
    for path in _sources():
        relative = path.relative_to(ROOT).as_posix()
        if relative == HOME:
            continue
        stray += [f"{relative}:{line}: {what}" for line, what in strays(ast.parse(path.read_text(), relative))]
    assert not stray, "use training.contract instead:\n" + "\n".join(stray)


def test_one_usage_error_serves_every_command():
    defined = [
        path.relative_to(ROOT).as_posix()
        for path in _sources()
        if any(isinstance(node, ast.ClassDef) and node.name == "UsageError" for node in ast.walk(ast.parse(path.read_text())))
    ]  # fmt: skip
    assert defined == [HOME]


@pytest.mark.parametrize(
    "source",
    [
        "import sys\nsys.exit(3)\n",
        "def main():\n    return 2\n",
        "def train_main(argv):\n    return 0\n",
        "if info.exit_status == 3:\n    pass\n",
        "if 2 != result.returncode:\n    pass\n",
        "raise SystemExit(1)\n",
        "stamp = time.strftime('%Y%m%d-%H%M')\n",
        "RUN = re.compile(r'[0-9]{8}-[0-9]{4}-[0-9a-f]{4}')\n",
    ],
)
def test_each_kind_of_stray_literal_is_found(source):
    assert strays(ast.parse(source))


@pytest.mark.parametrize(
    "source",
    [
        "def helper():\n    return 2\n",  # not a command's exit
        "ok = result.returncode == 0\n",  # any program's success
        "sys.exit(main())\n",
        "if exit_status == EXIT_OOM:\n    pass\n",
    ],
)
def test_what_is_not_an_exit_code_literal_is_left_alone(source):
    assert not strays(ast.parse(source))
