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
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import pytest

from backends import alerts, kill, watch
from backends.cli import main
from backends.config import load_config
from tests.backends.test_kill import FAKE_SMI
from tests.conftest import end_tmux_server

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
    path = tmp_path / "config.toml"
    path.write_text(
        f"[defaults]\nnvidia_smi = {json.dumps(FAKE_SMI)}\n"
        f"[hosts.local]\nruns_root = {json.dumps(str(roots[0]))}\n"
        f"[hosts.node2]\naddress = {json.dumps(sshd.address)}\nport = {sshd.port}\nuser = {json.dumps(sshd.user)}\n"
        f"known_hosts = {json.dumps(str(sshd.known_hosts))}\nidentity_file = {json.dumps(str(sshd.client_key))}\n"
        f"prefix = {json.dumps(env)}\nruns_root = {json.dumps(str(roots[1]))}\n"
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
def test_two_nodes_train_as_two_processes_and_stop_together(capsys, two_hosts):
    config, _, _ = two_hosts
    # One node × two processes: the reference, and issue 23's item 2 (a torchrun run
    # stopped by trackside ends `stopped` with exit 0).
    one = cli(capsys, "launch", "--config", config, "--host", "local", "--",
              PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "training", "train", *ARGS)  # fmt: skip
    two = cli(capsys, "launch", "--config", config, "--hosts", "local,node2", "--nproc-per-node", "1", "--",
              "trackside", "train", *ARGS)  # fmt: skip
    assert [(n["host"], n["session"]) for n in two["nodes"]] == [("local", f"ts-{two['run_id']}"), ("node2", f"ts-{two['run_id']}")]
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
    # node 0's worker gets SIGTERM; the trainer's all-reduce stops node 1's at the same step
    assert [(r["host"], len(r["signalled"]), r["killed"], r["exit_status"]) for r in [report, *report["nodes"]]] == [
        ("local", 1, [], 0), ("node2", 0, [], 0)]
    run = listed(capsys, config, two["run_id"])
    assert (run["state"], run["exit_status"], run["end_status"]) == ("exited", 0, "stopped")
    assert [(n["state"], n["exit_status"], n["pids"]) for n in run["nodes"]] == [("exited", 0, [])] * 2

    reference, nodes = losses(one), losses(two)
    common = sorted(set(reference) & set(nodes))
    assert common[:3] == [1, 2, 3]
    for step in common:
        assert nodes[step] == pytest.approx(reference[step], rel=1e-5), step


@pytest.mark.slow
def test_a_node_that_dies_is_named_and_the_other_is_stopped(capsys, two_hosts):
    config, _, _ = two_hosts
    two = cli(capsys, "launch", "--config", config, "--hosts", "local,node2", "--", "trackside", "train", *ARGS)
    wait_for(lambda: len(losses(two)) >= 2, what="2 steps")
    loaded = load_config(config)
    hosts = loaded.make_hosts()
    watched = [watch.Watched(hosts[name], FAKE_SMI) for name in ("local", "node2")]
    book = alerts.AlertBook(since=0)
    said: list[str] = []

    async def scenario():
        try:
            await watch.watch(watched, book, once=True, say=said.append, grace_s=30)  # sees it running
            plan = await kill.plan_kill(hosts["node2"], two["run_id"])  # node2's own part: its worker
            (worker,) = plan.first
            os.kill(worker, signal.SIGKILL)
            deadline = time.monotonic() + 60
            while not any("lost a node" in line for line in said):
                assert time.monotonic() < deadline, said
                await watch.watch(watched, book, once=True, say=said.append, grace_s=30)
                await asyncio.sleep(0.2)
        finally:
            await asyncio.gather(*(h.close() for h in hosts.values()))

    asyncio.run(scenario())
    line = next(line for line in said if "lost a node" in line)
    assert "node 1 on node2" in line, said
    run = listed(capsys, config, two["run_id"])
    assert run["state"] != "running" and all(n["state"] != "running" and not n["pids"] for n in run["nodes"]), run
