import json
import pstats
import sys
from pathlib import Path

import pytest

from tests.bench_runs import run_bench


@pytest.mark.slow
def test_launches_at_each_length_report_their_first_step_and_keep_the_profile(tmp_path):
    run_bench("first_step.py", "--preset", "tiny", "--lengths", "256", "384", "--device", "cpu",
              "--samples", "8", "--profile", "384", out=tmp_path, timeout=300,
              env={"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")})  # no kernels yet: cold
    rows = json.loads((tmp_path / "first_step.json").read_text())
    assert [(r["max_seq_len"], r["cache"], r["exit"]) for r in rows] == [
        (256, "cold", 0), (384, "new length", 0)]
    for r in rows:
        assert 0 < r["start_event_s"] <= r["first_step_s"] <= r["wall_s"]
    assert "profiled" in rows[1] and "profiled" not in rows[0]
    assert "Ordered by: cumulative time" in (tmp_path / "first_step_384.prof.txt").read_text()
    # the trainer's own profile (asked of the whole profile: which imports fill its top
    # entries depends on what the machine has cached)
    profiled = pstats.Stats(str(tmp_path / "first_step_384.prof")).stats
    assert any(file.endswith("training/loop.py") for file, _, _ in profiled)


def test_a_torch_without_bytecode_that_may_not_write_it_is_named(tmp_path, monkeypatch):
    """As on the lent H200 machine: every launch compiles torch's Python from source, which
    the bench must say. (Asked of the function: launching without bytecode costs ~40 s of
    CPU a process here.)"""
    import importlib.util
    from types import SimpleNamespace

    from bench import first_step

    real = sys.flags

    def flags(dont_write_bytecode: bool) -> SimpleNamespace:
        return SimpleNamespace(**{**{name: getattr(real, name) for name in type(real).__match_args__},
                                  "dont_write_bytecode": dont_write_bytecode})

    source = tmp_path / "torch" / "__init__.py"
    source.parent.mkdir()
    source.write_text("")
    monkeypatch.setattr(first_step.torch, "__file__", str(source))
    monkeypatch.setattr(first_step.sys, "flags", flags(True))
    assert first_step.without_torch_bytecode()
    monkeypatch.setattr(first_step.sys, "flags", flags(False))  # it writes its bytecode once
    assert not first_step.without_torch_bytecode()
    monkeypatch.setattr(first_step.sys, "flags", flags(True))  # bytecode there: it is read
    compiled = Path(importlib.util.cache_from_source(str(source)))
    compiled.parent.mkdir(parents=True, exist_ok=True)
    compiled.write_bytes(b"")
    assert not first_step.without_torch_bytecode()


def test_the_first_launch_is_called_cold_only_with_no_kernels_on_disk(tmp_path, monkeypatch):
    from bench.first_step import inductor_cache_is_empty
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    assert inductor_cache_is_empty()  # (asking makes the directory, empty)
    assert inductor_cache_is_empty()
    (tmp_path / "inductor" / "fxgraph").mkdir()
    assert not inductor_cache_is_empty()
