"""bench/fp8_matmul.py on the CPU (--smoke): fp8's casts run eagerly at tiny sizes and
the report names each; the matmuls need a CUDA card of fp8 (the device machine)."""
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_smoke_times_every_cast_and_writes_its_report(tmp_path):
    done = subprocess.run([sys.executable, "bench/fp8_matmul.py", "--smoke"], cwd=REPO,
                          env={**os.environ, "OUT": str(tmp_path)}, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "fp8_matmul.json").read_text())
    names = [row["name"] for row in report["rows"]]
    assert len(names) == 6 and len(set(names)) == 6
    assert all(name.split()[0] in ("to_fp8", "weights_to_fp8", "swiglu_to_fp8",
                                   "swiglu_to_fp8_t") for name in names)
    for row in report["rows"]:
        assert row["ms"] > 0 and row["gbps"] > 0
        assert row["name"] in done.stdout
