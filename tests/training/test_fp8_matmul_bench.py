"""bench/fp8_matmul.py on the CPU (--smoke): fp8's casts run eagerly at tiny sizes and
the report names each; the matmuls need a CUDA card of fp8 (the device machine)."""
import json

from tests.bench_runs import run_bench


def test_smoke_times_every_cast_and_writes_its_report(tmp_path):
    stdout = run_bench("fp8_matmul.py", "--smoke", out=tmp_path, timeout=120)
    report = json.loads((tmp_path / "fp8_matmul.json").read_text())
    names = [row["name"] for row in report["rows"]]
    assert len(names) == 6 and len(set(names)) == 6
    assert all(name.split()[0] in ("to_fp8", "weights_to_fp8", "swiglu_to_fp8",
                                   "swiglu_to_fp8_t") for name in names)
    for row in report["rows"]:
        assert row["ms"] > 0 and row["gbps"] > 0
        assert row["name"] in stdout
