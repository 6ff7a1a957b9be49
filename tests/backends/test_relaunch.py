"""One relaunch for any run: backends.relaunch reads the run's manifest and relaunches one
run on its host or every node of a multi-node run, so the CLI and the dashboard never
decide it themselves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from backends import kill, runs, tmux
from backends.hosts import LocalHost
from backends.relaunch import relaunch
from backends.runs.rundir import write_manifest
from backends.ship.deliver import Delivery
from tests.backends.test_runs import tmux_dir  # noqa: F401  (a tmux server of the test's own)
from training.contract import UsageError, new_run_id

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def host(tmux_dir, runs_root):  # noqa: F811
    return LocalHost(runs_root=runs_root)


async def test_a_run_on_one_host_is_relaunched_there_with_its_parent_named(host):
    parent = await runs.launch(host, ["sleep", "30"])
    child, sent = await relaunch({host.name: host}, host, parent.run_id, {})
    assert sent is None and child.parent == parent.run_id and child.host == host.name
    assert (await runs.read_manifest(host, child.run_id))["argv"] == ["sleep", "30"]
    assert child.judged  # how its start was judged, as a launch says


async def test_a_multi_node_run_goes_to_every_node_and_refuses_what_one_node_cannot_take(host):
    run_id = new_run_id()
    directory = await runs.run_dir(host, run_id)
    nodes = [{"host": name, "session": f"s-{i}", "run_dir": directory} for i, name in enumerate(["gpu1", "gpu2"])]
    await write_manifest(host, {"run_id": run_id, "run_dir": directory, "argv": ["trackside", "train"], "params": {},
                                "nodes": nodes, "node": 0, "nproc_per_node": 1, "rdzv_endpoint": "10.0.0.1:29500"})  # fmt: skip
    with pytest.raises(UsageError, match="--resume: a multi-node run's checkpoint is on one node only"):
        await relaunch({host.name: host}, host, run_id, {}, resume=True)
    with pytest.raises(UsageError, match="--ship is for a run on one host"):
        await relaunch({host.name: host}, host, run_id, {}, ship=Delivery(), ship_asked=True)
    # Taken to its nodes, which are not hosts here: nothing is launched anywhere.
    with pytest.raises(runs.RunError, match="has nodes on gpu1, gpu2, not hosts of the config"):
        await relaunch({host.name: host}, host, run_id, {})
    assert sorted(p.name for p in Path(host.runs_root).iterdir()) == [run_id]


def test_only_backends_relaunch_chooses_between_one_node_and_many():
    callers = {
        str(path.relative_to(ROOT))
        for package in ("tui", "backends") for path in (ROOT / package).rglob("*.py")
        if re.search(r"(?<!def )\b(?:runs\.relaunch|relaunch_nodes)\(", path.read_text(encoding="utf-8"))
    }  # fmt: skip
    assert callers == {"backends/relaunch.py"}


async def test_a_relaunch_keeps_the_session_name_the_user_gave_once_its_session_is_gone(host):
    """`launch --session mytrain`, killed, relaunched: `tmux attach -t mytrain` finds the
    new run (it came back as ts-… before, issue 44)."""
    parent = await runs.launch(host, ["sleep", "30"], session="mytrain")
    await kill.kill_run(host, parent.run_id, grace_s=5, nvml=False)
    child, _ = await relaunch({host.name: host}, host, parent.run_id, {})
    assert child.session == "mytrain" and not child.session_note
    assert (await runs.read_manifest(host, child.run_id))["session"] == "mytrain"
    assert [p.pid for p in await tmux.list_panes(host, "mytrain")] == child.pids


async def test_an_ended_runs_session_passes_its_name_on_and_a_live_one_says_where_the_run_went(host):
    ended = await runs.launch(host, ["true"], session="done")  # its dead pane kept in its session
    child, _ = await relaunch({host.name: host}, host, ended.run_id, {})
    assert child.session == "done" and not child.session_note
    live = await runs.launch(host, ["sleep", "30"], session="busy")
    beside, _ = await relaunch({host.name: host}, host, live.run_id, {})
    assert beside.session == runs.session_name(beside.run_id)
    assert beside.session_note == f"its parent still runs in tmux session busy: this run is in tmux session {beside.session}"
    assert [p.pid for p in await tmux.list_panes(host, "busy")] == live.pids  # left alone
