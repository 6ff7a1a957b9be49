"""A run's exit status is recorded one way in every file: the shell's (128 + N for signal
N), as the pane's sh writes `exit_status`; the manifest said -15 beside its 143 (issue 32,
item 7). In memory, and so in every view, a signal is minus its number (killed (SIGTERM))."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backends import runs
from backends.runs import RunPhase
from backends.runs.status import describe
from tests.backends.test_runs import PY, ended, eventually, host, run_named, tmux_dir  # noqa: F401 (fixtures)


def recorded(run_dir: str) -> tuple[str, int]:
    """(the exit_status file's text, the manifest's exit_status)."""
    manifest = json.loads(Path(run_dir, "manifest.json").read_text())
    return Path(run_dir, "exit_status").read_text().strip(), manifest["exit_status"]


async def test_a_signal_is_recorded_the_shells_way_in_both_files(host):
    info = await runs.launch(host, ["sh", "-c", "kill -TERM $$"], startup_s=0)
    done = await eventually(lambda: ended(host, info.run_id))  # the listing records the end
    assert recorded(info.run_dir) == ("143", 143)
    assert (done.exit_status, describe(done)) == (-15, "killed (SIGTERM)")
    again = await run_named(host, info.run_id)  # read from the manifest now
    assert (again.state, again.exit_status, describe(again)) == (RunPhase.EXITED, -15, "killed (SIGTERM)")
    # A launch that failed to start records its end too.
    with pytest.raises(runs.RunError, match="killed by signal 15"):
        await runs.launch(host, ["sh", "-c", "kill -TERM $$"], session="dies")
    [failed] = [r for r in await runs.list_runs(host) if r.session == "dies"]
    assert recorded(failed.run_dir) == ("143", 143) and failed.exit_status == -15


async def test_a_manifest_written_before_reads_as_it_did(host):
    info = await runs.launch(host, [PY, "-c", "import sys; sys.exit(3)"], startup_s=0)
    await eventually(lambda: ended(host, info.run_id))
    path = Path(info.run_dir, "manifest.json")
    path.write_text(json.dumps({**json.loads(path.read_text()), "exit_status": -9}))
    assert (await run_named(host, info.run_id)).exit_status == -9
