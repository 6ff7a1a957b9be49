"""The dashboard as `pip install .` gives it, without the train extra: scripts/test_no_extras.sh
builds that venv (no torch may be fetched) and runs tests/tui/test_no_torch.py in it.

A test of the suite, rather than a step of the test command, so it runs beside the others."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_the_dashboard_without_torch_opens_edits_and_relaunches(record_property):
    done = subprocess.run(
        ["bash", "scripts/test_no_extras.sh"], cwd=REPO, capture_output=True, text=True, timeout=380
    )
    said = done.stdout[-3000:] + done.stderr[-3000:]
    assert done.returncode == 0, said
    summary = re.search(r"(\d+) passed(.*) in [\d.]+s", done.stdout)
    assert summary and "skipped" not in summary[2] and "failed" not in summary[2], said
    record_property("summary", f"installed without extras: {summary[0]}")
