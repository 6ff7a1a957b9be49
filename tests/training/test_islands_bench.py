"""bench/islands.py on the CPU: every island runs, eagerly, at the tiny preset's shapes."""
import json

from tests.bench_runs import run_bench


def test_smoke_times_every_island_and_writes_its_report(tmp_path):
    run_bench("islands.py", "--smoke", out=tmp_path, timeout=120)
    report = json.loads((tmp_path / "islands.json").read_text())
    names = [row["island"] for row in report["rows"]]
    assert len(names) == 9 and len(set(names)) == 9
    assert {row["mode"] for row in report["rows"]} == {"trainer"}
    for row in report["rows"]:
        assert row["s"] > 0 and row["bytes"] > 0
    # the islands the trainer takes a gradient through are timed forward and backward too
    with_grad = {row["island"] for row in report["rows"] if "fb_s" in row}
    assert with_grad == {"rms_norm [L, H]", "input norms side by side [L, 2H]",
                         "rope q [L, heads, D]"}
    assert report["copy_bytes_per_s"] > 0
