"""A run spanning hosts on the dashboard (issue 23): listed once in the fleet with each
node under it, its run screen showing every node's GPUs and every rank's peak, and `k`
naming every node's PIDs, exactly the plan's.

The fast tests feed the app each host's listing as its monitor would (scripts/sample.py);
the slow one runs the real thing: a 2-node × 1-process gloo run on CPU over this machine
and the test sshd on 127.0.0.1 (tests/backends/test_multinode.py's hosts), watched by the
app, stopped with `k`, and relaunched with `r`.
"""

from __future__ import annotations

import dataclasses
import re

import pytest

from backends import nodes
from backends.config import load_config
from backends.runs import RunPhase
from tests.backends.test_kill import FAKE_SMI
from tests.backends.test_multinode import ARGS, two_hosts  # noqa: F401 (a fixture)
from tests.tui.conftest import screen_text, wait_for
from tests.waiting import HANG_S
from tui.app import TracksideApp, Watched
from tui.messages import GpusPolled, RunsListed
from scripts.sample import (
    MULTI_HOSTS, MULTI_ID, MULTI_KEY, NOW, feed_multinode, gpus, make_multinode_app, multinode_parts, multinode_plan,
)  # fmt: skip
from tui.screens.fleet import FleetScreen
from tui.screens.kill import KillConfirm, KillReportScreen, plan_text
from tui.screens.run import RunScreen
from tui.widgets.gpu_panel import GpuRow


def named_pids(text: str) -> list[list[int]]:
    """The PIDs a kill dialog names on its `processes` lines, one list per node."""
    return [[int(pid) for pid in line.split()[1:]] for line in text.replace(",", " ").splitlines() if line.startswith("processes")]


def fleet_rows(app) -> list[tuple[str, str, str]]:
    """The fleet's rows as (row key, name, state) in order."""
    return [(key, str(cells["name"]).strip(), str(cells["state"])) for key, cells in app.screen.rows()]


async def test_a_run_spanning_two_hosts_is_one_fleet_row_with_a_row_per_node():
    app = make_multinode_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await feed_multinode(pilot)
        assert list(app.runs) == [MULTI_KEY]  # one run, filed under its first node's host
        run = app.runs[MULTI_KEY]
        assert (run.home, run.host, run.hosts) == ("h200-a", "h200-b", list(MULTI_HOSTS))  # metrics: rank 0's node
        rows = fleet_rows(app)
        assert [r for r in rows if r[0].startswith("run:")] == [(f"run:{MULTI_KEY}", MULTI_ID, "running")]
        at = rows.index((f"run:{MULTI_KEY}", MULTI_ID, "running"))
        assert rows[at + 1 : at + 3] == [
            (f"node:{MULTI_KEY}#0", "├ h200-a", "running"), (f"node:{MULTI_KEY}#1", "└ h200-b", "running")]  # fmt: skip
        assert rows[at + 3][0] == "host:h200-b"  # nothing listed again under the other host
        # A node's row stands for its run: the keys act on it, Enter opens it.
        table = app.screen.query_one("#fleet")
        table.move_cursor(row=at + 2)
        assert app.screen.selected_run_key() == MULTI_KEY
        await pilot.press("enter")
        screen = await wait_for(pilot, lambda: isinstance(app.screen, RunScreen) and app.screen.is_mounted and app.screen, timeout=5, what="the run screen")
        assert screen.run_key == MULTI_KEY
        await pilot.pause()
        shown = screen.stats_shown.plain
        assert re.search(r"node 0 h200-a\s+running\s+PIDs 6100", shown) and re.search(r"node 1 h200-b\s+running\s+PIDs 7100", shown)
        # Every GPU of both hosts, each with its own power; every rank's peak from the step event.
        lines = [str(row.shown) for row in screen.query(GpuRow)]
        assert [line.split()[:2] for line in lines] == [[h, f"GPU{i}"] for h in MULTI_HOSTS for i in range(4)]
        assert "567/600 W" in lines[3] and "587/600 W" in lines[7]
        assert "peak GiB by rank  0:40.2  1:40.7  2:41.2  3:41.7  4:42.2  5:42.7  6:43.2  7:43.7" in shown
        # Two hosts of eight GPUs: all sixteen on screen, past the stylesheet's band of twelve.
        for host in MULTI_HOSTS:
            app.post_message(GpusPolled(host, gpus(), NOW))
        drawn = lambda: sum(" GPU" in line and "/600 W" in line for line in screen_text(app).splitlines())  # noqa: E731
        await wait_for(pilot, lambda: drawn() == 16, timeout=5, what="sixteen GPU rows drawn")


async def test_a_lost_node_is_an_alert_and_its_run_still_lists_once():
    app = make_multinode_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await feed_multinode(pilot)  # seen running: the loss that follows is news
        for host, part in zip(MULTI_HOSTS, multinode_parts(dead=True)):
            app.post_message(RunsListed(host, [part], NOW))
        await wait_for(pilot, lambda: f"node:{MULTI_ID}" in app.alerts, timeout=5, what="the lost-node alert")
        assert app.alerts[f"node:{MULTI_ID}"].text == f"{MULTI_ID} lost a node: node 1 on h200-b exit status 1"
        rows = fleet_rows(app)
        assert [r[1:] for r in rows if r[0].startswith("node:")] == [("├ h200-a", "running"), ("└ h200-b", "failed (1)")]
        # Stopped from here, how its nodes end is the operator's doing, no lost node.
        app.store.kill_started(MULTI_KEY)
        app._tick()
        assert f"node:{MULTI_ID}" not in app.alerts


def test_the_kill_dialog_names_every_nodes_pids_and_ranks_exactly_the_plans():
    plan = multinode_plan()
    text = plan_text(MULTI_KEY, plan, None).plain
    assert text.startswith(f"Stop run {MULTI_KEY} on h200-a+h200-b?")
    assert named_pids(text) == [part.pids for part in (plan, *plan.nodes)]
    ranks = [[int(p) for p in line.split("(")[0].replace(",", " ").split()[1:]] for line in text.splitlines() if line.startswith("ranks")]
    assert ranks == [list(part.first) for part in (plan, *plan.nodes)] and all(len(r) == 4 for r in ranks)
    assert "node 0 on h200-a" in text and "node 1 on h200-b" in text and "pid 8103 (python) on GPU 3" in text


def test_the_kill_dialog_of_a_one_host_torchrun_run_names_each_ranks_pid():
    """Two processes under torchrun on one host: its pane's shell, the agent and two
    workers, the workers named as the ranks (what `first` holds: SIGTERM goes to them)."""
    plan = dataclasses.replace(multinode_plan(), nodes=(), first=(8000, 8001), tree={pid: "t" for pid in (6100, 6101, 8000, 8001)})
    text = plan_text(MULTI_KEY, plan, None).plain
    assert named_pids(text) == [[6100, 6101, 8000, 8001]]
    assert "ranks         8000, 8001  (torchrun's workers, among the processes)" in text
    assert "node 0" not in text and "(SIGTERM, then SIGKILL after the grace period)" in text


@pytest.mark.slow
@pytest.mark.timeout(900)  # two torchruns and their workers start, stop and start again, as long as the load makes them
async def test_k_stops_a_real_two_node_run_named_once_in_the_fleet_and_r_relaunches_every_node(two_hosts):  # noqa: F811
    config_path, _, _ = two_hosts
    config = load_config(config_path)
    hosts = config.make_hosts()
    commands = {entry.name: entry.train_command for entry in config.hosts}
    try:
        info = await nodes.launch_nodes([hosts["local"], hosts["node2"]], ["trackside", "train", *ARGS], 1, train_commands=commands)
        key = f"local/{info.run_id}"
        app = TracksideApp([Watched(hosts[name], FAKE_SMI, commands[name]) for name in ("local", "node2")], poll_interval=0.25, grace_s=60)
        async with app.run_test(size=(160, 48)) as pilot:
            # Its start: two torch imports, as long as the machine's load makes them.
            await wait_for(pilot, lambda: (r := app.runs.get(key)) and r.start, timeout=HANG_S, what="rank 0's start event")
            # Listed once, both nodes running as their own hosts list them, rank 0's steps
            # followed from whichever node's run dir the rendezvous gave them.
            run = await wait_for(
                pilot, lambda: (r := app.runs.get(key)) and r.steps and all(n.state == "running" for n in r.info.nodes) and r,
                timeout=90, what="the run listed with both nodes running and rank 0's steps followed",
            )  # fmt: skip
            assert run.start["world_size"] == 2 and run.host in ("local", "node2")
            assert [k for k in app.runs if info.run_id in k] == [key]
            rows = fleet_rows(app)
            assert [r for r in rows if r[0].startswith("run:")] == [(f"run:{key}", info.run_id, "running")]
            assert [r[1:] for r in rows if r[0].startswith("node:")] == [("├ local", "running"), ("└ node2", "running")]
            assert isinstance(app.screen, FleetScreen) and app.screen.selected_run_key() == key

            await pilot.press("k")
            dialog = await wait_for(pilot, lambda: isinstance(app.screen, KillConfirm) and app.screen.is_mounted and app.screen, timeout=30, what="the kill dialog")
            plan = dialog.plan
            parts = (plan, *plan.nodes)
            assert [p.host for p in parts] == ["local", "node2"]
            text = dialog.question.plain
            await wait_for(pilot, lambda: "node 1 on node2" in screen_text(app), timeout=5, what="the dialog drawn")
            assert "node 0 on local" in screen_text(app)
            # Every node's PIDs, exactly the plan's: each pane's shell, its torchrun and its rank's worker.
            assert named_pids(text) == [p.pids for p in parts]
            assert all(len(p.first) == 1 and set(p.first) < set(p.pids) for p in parts)
            for node, part in zip(run.info.nodes, parts):
                assert set(node.pids) <= set(part.pids), (node, part)
            await pilot.press("y")
            shown = await wait_for(pilot, lambda: isinstance(app.screen, KillReportScreen) and app.screen.is_mounted and app.screen, timeout=120, what="the kill report")
            report = shown.report
            assert [(r.host, r.killed, r.exit_status) for r in (report, *report.nodes)] == [("local", [], 0), ("node2", [], 0)]
            assert set(report.signalled) <= set(plan.pids)  # nothing outside the plan
            await wait_for(pilot, lambda: "on node2" in screen_text(app), timeout=5, what="the report drawn, node2's part in it")
            await wait_for(
                pilot, lambda: app.runs[key].info.state is RunPhase.EXITED and all(n.state == "exited" for n in app.runs[key].info.nodes),
                timeout=30, what="both nodes listed as exited",
            )  # fmt: skip
            assert app.runs[key].status.label == "stopped" and not [k for k in app.alerts if info.run_id in k]

            # r: every node again, the child filed under the same first host.
            await pilot.press("escape")
            await wait_for(pilot, lambda: isinstance(app.screen, FleetScreen), timeout=5, what="the fleet")
            app.store.edited(key, {"ttt_steps": 2})
            await pilot.press("r")
            child = await wait_for(
                pilot, lambda: next((r for r in app.runs.values() if r.info.parent == info.run_id and len(r.info.nodes) == 2), None),
                timeout=60, what="the relaunch listed with both nodes",
            )  # fmt: skip
            assert child.home == "local" and [n.host for n in child.info.nodes] == ["local", "node2"]
            assert child.info.params["ttt_steps"] == 2
    finally:  # the relaunch still runs: the fixture's end kills both tmux servers' panes
        for host in hosts.values():
            await host.close()
