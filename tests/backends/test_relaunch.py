"""One relaunch for any run: backends.relaunch reads the run's manifest once and relaunches
one run on its host or every node of a multi-node run, so the CLI and the dashboard never
decide it themselves."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from backends import kill, runs, tmux
from backends.hosts import LocalHost
from backends.relaunch import Relaunch, relaunch
from backends.runs.rundir import write_manifest
from backends.ship.deliver import Delivery
from tests.backends.test_runs import tmux_dir  # noqa: F401  (a tmux server of the test's own)
from training.contract import UsageError, new_run_id

ROOT = Path(__file__).resolve().parents[2]


class CountingHost(LocalHost):
    """This machine, counting the manifests it is asked to read (the path, the read's last
    argument; a write names the file alone)."""

    def __init__(self, name: str = "local", *, runs_root: str) -> None:
        super().__init__(name, runs_root=runs_root)
        self.manifest_reads: Counter[str] = Counter()

    async def run(self, argv, **kwargs):
        if argv and argv[-1].endswith("/manifest.json"):
            self.manifest_reads[argv[-1].split("/")[-2]] += 1
        return await super().run(argv, **kwargs)


@pytest.fixture
def host(tmux_dir, runs_root):  # noqa: F811
    return CountingHost(runs_root=runs_root)


async def test_a_run_on_one_host_is_relaunched_there_with_its_parent_named(host):
    parent = await runs.launch(host, ["sleep", "30"])
    child, sent = await relaunch(Relaunch(host.name, parent.run_id), {host.name: host})
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
        await relaunch(Relaunch(host.name, run_id, resume=True), {host.name: host})
    with pytest.raises(UsageError, match="--ship is for a run on one host"):
        await relaunch(Relaunch(host.name, run_id, ship=Delivery(), ship_asked=True), {host.name: host})
    # Taken to its nodes, which are not hosts here: nothing is launched anywhere.
    with pytest.raises(runs.RunError, match="has nodes on gpu1, gpu2, not hosts of the config"):
        await relaunch(Relaunch(host.name, run_id), {host.name: host})
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
    child, _ = await relaunch(Relaunch(host.name, parent.run_id), {host.name: host})
    assert child.session == "mytrain" and not child.session_note
    assert (await runs.read_manifest(host, child.run_id))["session"] == "mytrain"
    assert [p.pid for p in await tmux.list_panes(host, "mytrain")] == child.pids


async def test_an_ended_runs_session_passes_its_name_on_and_a_live_one_says_where_the_run_went(host):
    ended = await runs.launch(host, ["true"], session="done")  # its dead pane kept in its session
    child, _ = await relaunch(Relaunch(host.name, ended.run_id), {host.name: host})
    assert child.session == "done" and not child.session_note
    live = await runs.launch(host, ["sleep", "30"], session="busy")
    beside, _ = await relaunch(Relaunch(host.name, live.run_id), {host.name: host})
    assert beside.session == runs.session_name(beside.run_id)
    assert beside.session_note == f"its parent still runs in tmux session busy: this run is in tmux session {beside.session}"
    assert [p.pid for p in await tmux.list_panes(host, "busy")] == live.pids  # left alone


async def test_a_relaunch_reads_its_runs_manifest_once_and_hands_it_on(host):
    """One host: backends.relaunch reads the manifest to decide, runs.relaunch is given it
    (it read it again before). Every node: each node's manifest once, on its own host."""
    parent = await runs.launch(host, ["sleep", "30"])
    host.manifest_reads.clear()
    await relaunch(Relaunch(host.name, parent.run_id), {host.name: host})
    assert host.manifest_reads[parent.run_id] == 1

    run_id = new_run_id()
    fleet = {name: CountingHost(name, runs_root=f"{host.runs_root}/{name}") for name in ("gpu1", "gpu2")}
    spans = [{"host": name, "session": runs.session_name(run_id), "run_dir": await runs.run_dir(h, run_id)} for name, h in fleet.items()]
    for i, h in enumerate(fleet.values()):
        await write_manifest(h, {"run_id": run_id, "run_dir": spans[i]["run_dir"], "session": runs.session_name(run_id),
                                 "argv": ["sleep", "30"], "params": {}, "nodes": spans, "node": i,
                                 "nproc_per_node": 1, "rdzv_endpoint": "127.0.0.1:29500"})  # fmt: skip
    with pytest.raises(runs.RunError, match="runs the trainer"):  # refused before any node starts
        await relaunch(Relaunch("gpu2", run_id), fleet)
    assert [h.manifest_reads[run_id] for h in fleet.values()] == [1, 1]
