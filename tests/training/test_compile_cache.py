"""Compiled kernels kept under the runs root (training/compile_cache.py): a later process
whose inductor cache is cold finds them, and a kept file anyone else could have written
is never loaded. Real torch.compile on the CPU, each process with its own inductor cache."""
from __future__ import annotations

import json
import lzma
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# One process of a launch: load what is kept (under each runs root given; `keep` writes to
# the last), compile and run forward and backward, keep.
LAUNCH = """
import json, os, sys
from pathlib import Path
import torch
from training import compile_cache

places = tuple(Path(p) for p in os.environ.get("PLACES", "").split(":") if p)  # stand-ins for the package's folder
said = [line for root in sys.argv[1:] for line in compile_cache.load(Path(root), torch.device("cpu"), places=places)]
cached = sum(len(files) for _, _, files in os.walk(os.environ["TORCHINDUCTOR_CACHE_DIR"]))
# Matmuls alone: inductor calls them out, so a graph compiles in seconds, nothing built in C++.
graph = os.environ["GRAPH"]
if graph.startswith("/"):  # the graph's code in a module of that folder
    sys.path.insert(0, graph)
    from graph_code import f
elif graph:
    f = (lambda x, w: x @ w) if graph == "plain" else (lambda x, w: (x @ w).t())
if graph:
    x = torch.randn(48, 32, requires_grad=True)
    torch._dynamo.maybe_mark_dynamic(x, 0)
    torch.compile(f, fullgraph=True)(x, torch.randn(32, 16)).sum().backward()
counts = dict(torch._dynamo.utils.counters["inductor"])
print(json.dumps({"said": said, "cached_after_load": cached, "kept": compile_cache.keep(),
                  "hits": counts.get("fxgraph_cache_hit", 0), "misses": counts.get("fxgraph_cache_miss", 0),
                  "autograd_hits": torch._dynamo.utils.counters["aot_autograd"].get("autograd_cache_hit", 0)}))
"""


def launch(inductor_cache: Path, *runs_roots: Path, graph: str = "plain", places: tuple[Path, ...] = ()) -> dict:
    """graph: "plain" or "transposed" (another graph), or "": load only, compile nothing."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(inductor_cache), "PYTHONPATH": str(REPO),
           "GRAPH": graph, "PLACES": ":".join(map(str, places))}
    done = subprocess.run([sys.executable, "-c", LAUNCH, *map(str, runs_roots)], env=env, capture_output=True,
                          text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def kept(tmp_path_factory) -> tuple[Path, dict]:
    """A runs root after one launch on a cold box."""
    root = tmp_path_factory.mktemp("runs")
    first = launch(tmp_path_factory.mktemp("inductor"), root)
    return root, first


def kept_file(root: Path) -> Path:
    """The first launch's set."""
    (folder,) = (root / "compiled").iterdir()
    return min(folder.iterdir(), key=lambda p: p.stat().st_mtime)


def test_the_first_launch_compiles_and_keeps_what_it_compiled(kept):
    root, first = kept
    assert first["said"] == [] and first["misses"] >= 2 and first["hits"] == 0
    path = kept_file(root)
    assert first["kept"] == f"{path}: {path.stat().st_size / 2**20:.1f} MiB of compiled artifacts kept for the next launch"
    assert path.parent.name.startswith("torch-") and path.parent.name.endswith("-cpu")
    assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700


def test_another_graphs_set_is_kept_beside_and_a_cold_cache_finds_both(kept, tmp_path):
    root, first = kept
    other = launch(tmp_path / "cold-1", root, graph="transposed")  # another drafter, another model
    folder = kept_file(root).parent
    assert other["said"] == [f"{folder}: {first['misses'] + 1} compiled artifacts loaded"]
    assert other["hits"] == 0 and other["misses"] >= 2
    assert other["kept"].startswith(f"{folder}/") and len(list(folder.iterdir())) == 2
    again = launch(tmp_path / "cold-2", root)
    assert again["said"] == [f"{folder}: {first['misses'] + other['misses'] + 2} compiled artifacts loaded"]
    assert again["hits"] == first["misses"] and again["misses"] == 0 and again["cached_after_load"] > 0
    assert again["kept"] is None  # all it used was loaded: nothing written


def test_a_set_kept_by_code_at_one_path_serves_the_same_code_at_another(tmp_path):
    """A shipped set was kept where the code ran on the box that made it and is loaded where
    the package is installed: no path may be in what finds it."""
    for place in ("made", "installed"):
        (tmp_path / place).mkdir()
        (tmp_path / place / "graph_code.py").write_text("def f(x, w):\n    return (x @ w) @ w.t()\n")
    root = tmp_path / "runs"
    first = launch(tmp_path / "cold-1", root, graph=str(tmp_path / "made"))
    assert first["kept"] and first["misses"] >= 2
    again = launch(tmp_path / "cold-2", root, graph=str(tmp_path / "installed"))
    assert again["autograd_hits"] == 1 and again["misses"] == 0 and again["kept"] is None


def test_a_launch_that_keeps_a_set_removes_those_of_the_format_before(tmp_path):
    """Sets kept uncompressed (.bin) by earlier versions are never loaded: the next set
    kept removes them, a link among them as a link (what it points to stays)."""
    import torch
    from training.compile_cache import target
    folder = tmp_path / "runs" / "compiled" / target(torch.device("cpu"))
    folder.mkdir(parents=True, mode=0o700)
    (tmp_path / "runs" / "compiled").chmod(0o700)
    (folder / "0123456789abcdef.bin").write_bytes(b"old set")
    elsewhere = tmp_path / "elsewhere.bin"
    elsewhere.write_bytes(b"not ours")
    (folder / "fedcba9876543210.bin").symlink_to(elsewhere)
    first = launch(tmp_path / "cold", tmp_path / "runs")
    assert first["kept"] and [p.suffix for p in folder.iterdir()] == [".xz"]
    assert elsewhere.read_bytes() == b"not ours"


TAMPERS = ("group-writable", "someone else's", "a link", "folder a link")


def test_a_kept_file_another_user_could_have_written_is_not_loaded(kept, tmp_path):
    """The artifacts are pickles and generated code: loading a planted one runs it. One
    process meets each way in turn; one of them loaded would have written inductor's cache
    (as an untampered set does in the test above) and shown as cache hits."""
    source, _ = kept
    path = kept_file(source)
    target, name = path.parent.name, path.name
    roots = [tmp_path / tamper.replace(" ", "-").replace("'", "") for tamper in TAMPERS]
    for tamper, root in zip(TAMPERS, roots):
        (root / "compiled").mkdir(parents=True)
        folder = root / "compiled" / target
        if tamper == "folder a link":
            folder.symlink_to(path.parent)
            continue
        folder.mkdir(mode=0o700)
        if tamper == "a link":
            (folder / name).symlink_to(path)
            continue
        (folder / name).write_bytes(path.read_bytes())
        (folder / name).chmod(0o620 if tamper == "group-writable" else 0o600)
        if tamper == "someone else's":
            os.chown(folder / name, 65534, 65534)
    before = sorted(path.parent.iterdir())
    again = launch(tmp_path / "cold", *roots)
    assert again["said"] == [
        *(f"{root / 'compiled' / target}: 0 compiled artifacts loaded; not loaded, a link or another "
          f"user could write it: {name}" for root in roots[:3]),
        f"{roots[3] / 'compiled' / target}: nothing loaded: it or its folder is a link, or another user "
        "could write it"]
    assert again["cached_after_load"] == 0 and again["hits"] == 0 and again["misses"] >= 2  # compiled afresh
    # what it compiled is not written through the link either
    assert again["kept"].startswith(f"{roots[3] / 'compiled' / target}: compiled artifacts not kept")
    assert sorted(path.parent.iterdir()) == before


@pytest.mark.gpu
def test_the_trainer_keeps_its_islands_and_a_cold_launch_loads_them(tmp_path, cache):
    """On the card the islands compile: the first launch keeps them under its runs root,
    a second one with inductor's cache cold loads them and keeps nothing new. The package
    is a copy without the sets it ships, so only the runs root's count."""
    code = tmp_path / "code"
    shutil.copytree(REPO / "training", code / "training", ignore=shutil.ignore_patterns("compiled", "__pycache__"))

    def train(label: str) -> list[str]:
        env = {**os.environ, "TRACKSIDE_RUNS_ROOT": str(tmp_path / "runs"), "PYTHONPATH": str(code),
               "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / label)}
        done = subprocess.run([sys.executable, "-m", "training", "train", "--synthetic", "--steps", "2",
                               "--device", "cuda", "--max-seq-len", "512", "--out", str(tmp_path / label / "run")],
                              cwd=code, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        return [line for line in done.stdout.splitlines() if "compiled artifacts" in line]

    first = train("first")
    assert len(first) == 1 and first[0].endswith("MiB of compiled artifacts kept for the next launch")
    (folder,) = (tmp_path / "runs" / "compiled").iterdir()
    assert folder.name.startswith("torch-") and "-sm" in folder.name
    second = train("second")
    assert len(second) == 1 and second[0].startswith(f"train: {folder}: ")
    assert int(second[0].split(": ")[-1].split()[0]) > 0 and second[0].endswith("compiled artifacts loaded")


def test_the_packages_sets_are_trusted_as_its_code_and_one_that_is_no_set_fails_to_load(kept, tmp_path):
    """A checkout made under umask 002 leaves the package's files group-writable, its code
    and its sets alike: the sets load (a runs root's would be refused). A file that is no
    set of torch's artifacts is said to have failed, not counted as loaded."""
    source, first = kept
    path = kept_file(source)
    package = tmp_path / "package"
    (package / path.parent.name).mkdir(parents=True)
    (package / path.parent.name / path.name).write_bytes(path.read_bytes())
    (package / path.parent.name / path.name).chmod(0o664)
    (package / path.parent.name).chmod(0o775)
    junk = tmp_path / "runs" / "compiled" / path.parent.name
    junk.mkdir(parents=True, mode=0o700)
    (junk / "0000000000000000.xz").write_bytes(lzma.compress(b"not a pickle of torch's"))
    (junk / "0000000000000000.xz").chmod(0o600)
    again = launch(tmp_path / "cold", tmp_path / "runs", places=(package,))
    assert again["said"] == [f"{package / path.parent.name}: {first['misses'] + 1} compiled artifacts loaded",
                             f"{junk}: 0 compiled artifacts loaded; failed to load: 0000000000000000.xz (not torch's artifacts)"]
    assert again["hits"] == first["misses"] and again["misses"] == 0
