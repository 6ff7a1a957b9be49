"""Multi-node runs for real: two hosts — this machine (LocalHost) and the test sshd on
127.0.0.1, each with its own tmux server and runs root — running the real trainer on CPU
as one torchrun job (c10d, gloo), driven through the `trackside` CLI and `trackside watch`.

Every address involved is 127.0.0.1: the rendezvous endpoint (the first host is this
machine and so is the other), each agent's own address (torchrun's --local-addr, as its
PET_LOCAL_ADDR variable) and gloo's interface (GLOO_SOCKET_IFNAME=lo).

Loss agreement: two nodes × one process against one node × two processes at the same
global batch (2 rows) compute the same quantity and differ only in float summation order
(one gloo all-reduce of two ranks either way): relative 1e-5 per step, as
tests/training/test_torchrun.py holds one process to two.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import pytest

from backends import alerts, kill, nodes, watch
from backends.config import load_config
from backends.hosts import LocalHost
from backends.runs import NodeInfo, RunError, RunInfo, RunPhase
from scripts.local_box import end_tmux_server
from tests.backends.test_kill import FAKE_SMI
from tui.commands.headless import main
from tui.commands.runs import show_runs

PY = sys.executable
ARGS = ["--synthetic", "--steps", "100000", "--max-seq-len", "256", "--ttt-steps", "3", "--save-every", "0",
        "--batch-rows", "1"]  # fmt: skip
LOOPBACK = {"GLOO_SOCKET_IFNAME": "lo", "PET_LOCAL_ADDR": "127.0.0.1", "OMP_NUM_THREADS": "1"}


@pytest.fixture
def two_hosts(sshd, tmp_path, monkeypatch):
    """A config with hosts `local` (this machine) and `node2` (the sshd), each with its own
    tmux server (TMUX_TMPDIR) and runs root, so the two nodes' sessions and run dirs
    never meet though both are this machine. (path, local runs root, node2 runs root)"""
    if not sshd.running:
        sshd.start()
    tmux_dirs = [tempfile.mkdtemp(prefix="ts-mn-", dir="/tmp") for _ in range(2)]  # short: tmux's socket path
    roots = [tmp_path / "runs-local", tmp_path / "runs-node2"]
    cache = tmp_path / "xdg-cache"
    monkeypatch.setenv("TMUX_TMPDIR", tmux_dirs[0])
    monkeypatch.delenv("TMUX", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    for name, value in LOOPBACK.items():
        monkeypatch.setenv(name, value)
    env = ["env", f"TMUX_TMPDIR={tmux_dirs[1]}", f"XDG_CACHE_HOME={cache}", *(f"{k}={v}" for k, v in LOOPBACK.items())]
    # node2's GPUs are slower to read than this machine's, as a remote host's are: a kill
    # that signalled each node once it had read its GPUs reached node2's worker after the
    # all-reduce had stopped it, and signalled its torchrun agent instead (exit 1).
    slow_smi = tmp_path / "slow-nvidia-smi"
    slow_smi.write_text(f"#!/bin/sh\nsleep 1.5\nexec {FAKE_SMI} \"$@\"\n")
    slow_smi.chmod(0o755)
    path = tmp_path / "config.toml"
    path.write_text(
        f"[defaults]\nnvidia_smi = {json.dumps(FAKE_SMI)}\n"
        f"[hosts.local]\nruns_root = {json.dumps(str(roots[0]))}\n"
        f"[hosts.node2]\naddress = {json.dumps(sshd.address)}\nport = {sshd.port}\nuser = {json.dumps(sshd.user)}\n"
        f"known_hosts = {json.dumps(str(sshd.known_hosts))}\nidentity_file = {json.dumps(str(sshd.client_key))}\n"
        f"prefix = {json.dumps(env)}\nruns_root = {json.dumps(str(roots[1]))}\n"
        f"nvidia_smi = {json.dumps(str(slow_smi))}\n"
    )
    yield str(path), roots[0], roots[1]
    end_tmux_server("tmux")
    end_tmux_server("env", f"TMUX_TMPDIR={tmux_dirs[1]}", "tmux")
    for directory in tmux_dirs:
        shutil.rmtree(directory, ignore_errors=True)


def cli(capsys, *argv: str):
    code = main([*argv[:1], "--json", *argv[1:]])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def metrics(run: dict) -> list[dict]:
    """The run's metrics events: rank 0's, in whichever node's run dir the rendezvous gave it."""
    for directory in [n["run_dir"] for n in run.get("nodes", [])] or [run["run_dir"]]:
        path = Path(directory) / "metrics.jsonl"
        if path.exists():
            return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return []


def losses(run: dict) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in metrics(run) if e["event"] == "step"}


def wait_for(check, timeout: float = 180.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"{what} not met within {timeout:.0f}s"
        time.sleep(0.2)
    return value


def listed(capsys, config: str, run_id: str) -> dict:
    return next(r for r in cli(capsys, "runs", "--config", config) if r["run_id"] == run_id)


@pytest.mark.slow
def test_two_nodes_train_as_two_processes_stop_together_relaunch_and_lose_one(capsys, two_hosts):
    config, _, _ = two_hosts
    # One node × two processes: the reference, and issue 23's item 2 (a torchrun run
    # stopped by trackside ends `stopped` with exit 0).
    one = cli(capsys, "launch", "--config", config, "--host", "local", "--",
              PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "training", "train", *ARGS)  # fmt: skip
    two = cli(capsys, "launch", "--config", config, "--hosts", "local,node2", "--nproc-per-node", "1", "--session", "pair", "--",
              "trackside", "train", *ARGS)  # fmt: skip
    assert [(n["host"], n["session"]) for n in two["nodes"]] == [("local", "pair"), ("node2", "pair")]
    assert len({n["run_dir"] for n in two["nodes"]}) == 2
    wait_for(lambda: len(losses(one)) >= 3 and len(losses(two)) >= 3, what="3 steps of each run")

    run = listed(capsys, config, two["run_id"])
    assert run["state"] == "running" and [(n["host"], n["state"]) for n in run["nodes"]] == [("local", "running"), ("node2", "running")]
    assert all(n["pids"] for n in run["nodes"]) and run["params"]["batch_rows"] == 1
    start = metrics(two)[0]
    assert start["event"] == "start" and start["world_size"] == 2 and start["config"]["global_batch_rows"] == 2
    manifests = [json.loads((Path(n["run_dir"]) / "manifest.json").read_text()) for n in two["nodes"]]
    assert [m["node"] for m in manifests] == [0, 1] and {m["run_id"] for m in manifests} == {two["run_id"]}
    assert all(m["rdzv_endpoint"].startswith("127.0.0.1:") and "--rdzv-id" in m["command"] for m in manifests)

    stopped = cli(capsys, "kill", one["run_id"], "--config", config, "--grace", "60")
    assert stopped["exit_status"] == 0 and stopped["killed"] == [] and len(stopped["signalled"]) == 2
    ref = listed(capsys, config, one["run_id"])
    assert (ref["state"], ref["exit_status"], ref["end_status"]) == ("exited", 0, "stopped")

    report = cli(capsys, "kill", two["run_id"], "--config", config, "--grace", "60")
    # every node's worker gets SIGTERM: the trainer's all-reduce stops them at the same step,
    # and a worker already stopping absorbs the SIGTERM that reaches it later
    assert [(r["host"], len(r["signalled"]), r["killed"], r["exit_status"]) for r in [report, *report["nodes"]]] == [
        ("local", 1, [], 0), ("node2", 1, [], 0)]
    run = listed(capsys, config, two["run_id"])
    assert (run["state"], run["exit_status"], run["end_status"]) == ("exited", 0, "stopped")
    assert [(n["state"], n["exit_status"], n["pids"]) for n in run["nodes"]] == [("exited", 0, [])] * 2

    reference, nodes = losses(one), losses(two)
    common = sorted(set(reference) & set(nodes))
    assert common[:3] == [1, 2, 3]
    for step in common:
        assert nodes[step] == pytest.approx(reference[step], rel=1e-5), step

    # Relaunched with a change: every node again, its parent named; then node 1's worker
    # is SIGKILLed and `trackside watch` names it and stops node 0.
    child = cli(capsys, "relaunch", two["run_id"], "--config", config, "--set", "ttt_steps=2")
    assert child["parent"] == two["run_id"] and [n["host"] for n in child["nodes"]] == ["local", "node2"]
    assert [n["session"] for n in child["nodes"]] == ["pair", "pair"]  # the name given at launch, kept (issue 44)
    wait_for(lambda: len(losses(child)) >= 2, what="2 steps of the relaunch")
    assert metrics(child)[0]["config"]["ttt_steps"] == 2
    said = lose_node(config, child["run_id"])
    line = next(line for line in said if "lost a node" in line)
    # named by its host, with how its worker ended as its torchrun said (torchrun exits 1)
    assert re.search(r"node 1 on node2 exit status 1 \(rank \d killed by SIGKILL\)", line), said
    # node 0 waits on node 1 in its next all-reduce: the watcher stops it (the alert then says
    # so), unless gloo's error ended it first — seen dead in the same poll (the alert names
    # it too) or ending between that poll and the stop (the stop finds it gone). Either
    # way nothing of the run is left running.
    run = listed(capsys, config, child["run_id"])
    assert run["state"] != "running" and all(n["state"] != "running" and not n["pids"] for n in run["nodes"]), run


def lose_node(config: str, run_id: str) -> list[str]:
    """SIGKILL node 1's worker under a `trackside watch` (polled until it speaks); its lines."""
    hosts = load_config(config).make_hosts()
    watched = [watch.Watched(hosts[name], FAKE_SMI) for name in ("local", "node2")]
    book = alerts.AlertBook(since=0)
    said: list[str] = []

    async def scenario():
        try:
            await watch.watch(watched, book, once=True, say=said.append, grace_s=30)  # sees it running
            (worker,) = (await kill.plan_kill(hosts["node2"], run_id)).first  # node2's own part
            os.kill(worker, signal.SIGKILL)
            deadline = time.monotonic() + 60
            while not any("lost a node" in line for line in said):
                assert time.monotonic() < deadline, said
                await watch.watch(watched, book, once=True, say=said.append, grace_s=30)
                await asyncio.sleep(0.2)
        finally:
            await asyncio.gather(*(h.close() for h in hosts.values()))

    asyncio.run(scenario())
    return said


@pytest.mark.parametrize(
    "argv, names",
    [
        (["--hosts", "local,nope"], '--hosts: no host named "nope"'),
        (["--hosts", "local"], "--hosts"),
        (["--hosts", "local,local"], "--hosts"),
        (["--hosts", "local,other", "--nproc-per-node", "0"], "--nproc-per-node"),
        (["--nproc-per-node", "2"], "--nproc-per-node goes with --hosts"),
        (["--rdzv-host", "10.0.0.1"], "--rdzv-host goes with --hosts"),
        (["--host", "local", "--hosts", "local,other"], "--host and --hosts"),
        (["--hosts", "local,other", "--rdzv-host", "a;b"], "--rdzv-host"),
        (["--hosts", "local,far"], "--rdzv-host"),  # this machine first: 127.0.0.1 is no address for far
    ],
)
def test_bad_multinode_launches_exit_2_naming_the_flag(capsys, tmp_path, argv, names):
    config = tmp_path / "config.toml"
    config.write_text(
        f"[hosts.local]\nruns_root = {json.dumps(str(tmp_path))}\n[hosts.other]\nruns_root = {json.dumps(str(tmp_path))}\n"
        '[hosts.far]\naddress = "192.0.2.7"\n'  # never contacted: the launch is refused first
    )
    code = main(["launch", "--config", str(config), *argv, "--", "trackside", "train", "--synthetic"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and names in err and "Traceback" not in err, err
    assert list(tmp_path.iterdir()) == [config]  # nothing was launched


def test_a_multinode_launch_of_another_program_exits_2(capsys, tmp_path):
    config = tmp_path / "config.toml"
    config.write_text(f"[hosts.local]\nruns_root = {json.dumps(str(tmp_path))}\n[hosts.other]\nruns_root = {json.dumps(str(tmp_path))}\n")
    code = main(["launch", "--config", str(config), "--hosts", "local,other", "--", "sleep", "60"])
    assert code == 2 and "--hosts runs the trainer" in capsys.readouterr().err


async def test_a_multinode_launch_runs_the_trainer_on_distinct_hosts(tmp_path):
    a, b = LocalHost("a", runs_root=str(tmp_path)), LocalHost("b", runs_root=str(tmp_path))
    with pytest.raises(RunError, match="runs the trainer"):
        await nodes.launch_nodes([a, b], ["sleep", "60"], 1)
    with pytest.raises(RunError, match="two or more different hosts"):
        await nodes.launch_nodes([a, a], ["trackside", "train"], 1)


def test_torchrun_wraps_either_trainer_command():
    opts = {"nnodes": 2, "nproc_per_node": 4, "endpoint": "10.0.0.5:29400", "run_id": "20261201-1200-abcd"}
    venv = nodes.torchrun_command(["/v/bin/trackside", "train", "--out", "d"], serves=True, **opts)
    assert venv[0] == "/v/bin/torchrun" and venv[-4:] == ["/v/bin/trackside", "train", "--out", "d"]
    assert venv[venv.index("--rdzv-conf") + 1] == "is_host=true" and venv[venv.index("--rdzv-id") + 1] == opts["run_id"]
    module = nodes.torchrun_command(["/usr/bin/python3", "-m", "training", "train"], serves=False, **opts)
    assert module[:3] == ["/usr/bin/python3", "-m", "torch.distributed.run"] and module[-3:] == ["-m", "training", "train"]
    assert module[module.index("--nnodes") + 1] == "2" and module[module.index("--nproc-per-node") + 1] == "4"
    assert module[module.index("--rdzv-conf") + 1] == "is_host=false"


def node_part(host: str, node: int, state: RunPhase, status: int | None, *, metrics: bool = False, end: str | None = None) -> RunInfo:
    spans = [NodeInfo("gpu1", 0, "s", "/r"), NodeInfo("gpu2", 1, "s", "/r")]
    spans[node] = NodeInfo(host, node, "s", "/r", state.value, status, [7] if state is RunPhase.RUNNING else [])
    return RunInfo("20261201-1200-abcd", "s", host, state, status, last_step=5 if metrics else None,
                   steps_per_epoch=10 if metrics else None, pids=spans[node].pids, end_status=end, nodes=spans)  # fmt: skip


def test_a_runs_nodes_merge_into_one_entry_with_rank_0s_metrics():
    other = RunInfo(None, "foreign", "gpu1", RunPhase.RUNNING)
    # rank 0 on node 1 (c10d picks by address): the run's metrics are node 1's
    merged = nodes.merge([node_part("gpu1", 0, RunPhase.RUNNING, None), other, node_part("gpu2", 1, RunPhase.EXITED, -9, metrics=True)])
    assert [m.run_id for m in merged] == ["20261201-1200-abcd", None]
    run = merged[0]
    assert (run.host, run.last_step, run.state) == ("gpu2", 5, RunPhase.RUNNING)
    assert [(n.host, n.state, n.exit_status, n.pids) for n in run.nodes] == [("gpu1", "running", None, [7]), ("gpu2", "exited", -9, [])]
    alert = nodes.node_alert(run)
    assert alert.key == "node:20261201-1200-abcd" and "node 1 on gpu2 killed by SIGKILL" in alert.text
    shown = show_runs([run])
    assert "node 0 on gpu1  running" in shown and "node 1 on gpu2  exited (-9)" in shown
    # a clean stop: torchrun's exit 1 after the trainer's own `stopped` is no death
    stopped = nodes.merge([node_part("gpu1", 0, RunPhase.EXITED, 0, metrics=True, end="stopped"), node_part("gpu2", 1, RunPhase.EXITED, 1)])[0]
    assert (stopped.state, stopped.exit_status) == (RunPhase.EXITED, 0) and nodes.node_alert(stopped) is None
    # one host listed alone: the other node is unknown, never guessed
    alone = nodes.merge([node_part("gpu1", 0, RunPhase.EXITED, 0, metrics=True)])[0]
    assert alone.state is RunPhase.UNKNOWN and alone.nodes[1].state == "unknown"
