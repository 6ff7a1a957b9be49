"""Each drafter's code sits in its folder under training/drafters/, registered by its
--drafter name, and the trainer's shared parts name none of them: read from the source
(the imports as Python parses them), so a drafter's module moved back beside the loop, or
the loop asking for a drafter by name, fails here."""
from __future__ import annotations

import ast
from pathlib import Path

from training import drafters
from training.params import PARAMS

ROOT = Path(__file__).resolve().parents[2]
TRAINING = ROOT / "training"
FOLDERS = sorted(p.parent.name for p in (TRAINING / "drafters").glob("*/__init__.py"))
# Where each drafter's code lived before it had a folder.
FLAT = ("training.model", "training.attention", "training.loss", "training.loss_triton",
        "training.fold_triton", "training.export", "training.vocab", "training.dflash",
        "training.probe", "training.memory.terms", "training.memory.calibrate",
        "training.memory.search", "training.memory.dflash")
# The trainer's parts every drafter runs through, and the commands, which take the
# drafters' flags from the registry.
SHARED = ("loop", "packing", "data", "distributed", "device", "checkpoint", "mirror",
          "resume", "offload", "cli", "fit")


def imported(path: Path) -> set[str]:
    """Every module the file imports, `from a import b` as both a and a.b."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def reaches(names: set[str], module: str) -> bool:
    return any(name == module or name.startswith(module + ".") for name in names)


def test_the_registry_lists_exactly_the_folders():
    assert FOLDERS == sorted(drafters.DRAFTERS) and len(FOLDERS) >= 2
    for name, spec in drafters.DRAFTERS.items():
        assert spec.name == name
        assert spec.add_flags.__module__.startswith(f"training.drafters.{name}.")


def test_the_shared_trainer_names_no_drafter():
    for part in SHARED:
        path = TRAINING / f"{part}.py"
        names = imported(path)
        named = [m for m in (*FLAT, *(f"training.drafters.{f}" for f in FOLDERS))
                 if reaches(names, m)]
        assert named == [], path
        source = ast.parse(path.read_text(encoding="utf-8"))
        asked = [node.lineno for node in ast.walk(source)
                 if isinstance(node, ast.Constant) and node.value in FOLDERS
                 or isinstance(node, ast.Attribute) and node.attr in FOLDERS]
        assert asked == [], (path, asked)  # `cfg.dflash is None`, `== "eagle3"`


def test_each_drafters_code_sits_under_its_folder():
    outside = {}
    for path in TRAINING.rglob("*.py"):
        where = path.relative_to(TRAINING).parts
        home = where[1] if where[0] == "drafters" and len(where) > 2 else None
        names = imported(path)
        assert [m for m in FLAT if reaches(names, m)] == [], path
        for folder in FOLDERS:
            if folder != home and reaches(names, f"training.drafters.{folder}"):
                outside.setdefault(str(path.relative_to(ROOT)), set()).add(folder)
    # A drafter's folder reaches no other's; outside them only the registry names them, and
    # the reading of a run's shape by the drafter it trained.
    assert outside == {"training/drafters/__init__.py": set(FOLDERS),
                       "training/drafters/measured.py": set(FOLDERS)}


def test_each_parameter_of_one_drafter_is_that_drafters_flag():
    """The relaunchable parameters of one drafter (training/params.py) are flags its
    registration adds, and no other's."""
    for name, spec in drafters.DRAFTERS.items():
        own = set(spec.own_flags("train"))
        for param in PARAMS.values():
            assert (param.flag in own) == (param.drafter == name), (name, param.name)
