"""One kill plan: the PIDs a plan names are the PIDs the kill signals, for a launched run, a
session trackside did not launch and a torchrun run; a PID whose identity changed after
the plan is not signalled as planned; a run that had already ended is refused, not "stopped".
Real tmux, real processes; GPU memory from the fake nvidia-smi (see test_kill.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
from pathlib import Path

import pytest

from backends import kill, runs
from backends.gpu import GpuProcess
from tests.backends.test_cli import cli, config  # noqa: F401 (fixture)
from tests.backends.test_kill import FAKE_SMI, WORKERS, alive, bystanders, gpu_procs, ready_pids  # noqa: F401 (fixtures)
from tests.backends.test_runs import PY, ended, eventually, host, tmux_dir, written  # noqa: F401 (fixtures)

# A parent and a child that ignores SIGHUP, so only a signal of ours can end the child
# (closing the session hangs its terminal up). Each writes its pid to the file "$1".
HUP_PROOF_CHILD = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGHUP, signal.SIG_IGN); time.sleep(600)"])
open(sys.argv[1], "w").write(f"{os.getpid()} {child.pid}\\n")
time.sleep(600)
"""


def live_tree(pid: int) -> set[int]:
    """pid and its live descendants, read from /proc independently of the code under test."""
    found, stack = {pid}, [pid]
    while stack:
        parent = stack.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = {int(c) for c in (task / "children").read_text().split()}
            except OSError:
                continue
            stack.extend(children - found)
            found |= children
    return {p for p in found if alive(p)}


async def test_a_launched_run_is_signalled_exactly_as_planned(host, bystanders, gpu_procs):
    info = await runs.launch(host, [PY, "-c", WORKERS])
    parent, *workers = await ready_pids(info)
    gpu_procs({parent: (0, 1000), workers[1]: (1, 3000), bystanders[1]: (1, 500), bystanders[0]: (0, 0)})
    plan = await kill.plan_kill(host, info.run_id, smi=FAKE_SMI, nvml=False)
    # The recording sh, the run's python, both workers (one left the session): nothing else.
    assert plan.pids == sorted(live_tree(info.pids[0])) and len(plan.pids) == 4
    assert plan.pane_pids == (info.pids[0],) and plan.session == info.session and plan.run_id == info.run_id
    assert plan.tree[parent] == int(Path(f"/proc/{parent}/stat").read_text().rsplit(")", 1)[1].split()[19])  # its start, in clock ticks
    assert sorted(plan.holdings, key=lambda p: p.pid) == [GpuProcess(parent, 0, 1000, "python3"), GpuProcess(workers[1], 1, 3000, "python3")]
    # Holding memory on the run's GPU 1: named; on GPU 0 but holding nothing: not.
    assert plan.bystanders == (GpuProcess(bystanders[1], 1, 500, "python3"),)

    report = await kill.kill_run(host, plan, grace_s=10, smi=FAKE_SMI, nvml=False)
    assert report.signalled == plan.pids and report.killed == []
    assert not any(alive(p) for p in plan.pids) and all(alive(p) for p in bystanders)


async def test_a_foreign_session_is_signalled_exactly_as_planned(host, tmux_dir, tmp_path):
    pids = tmp_path / "pids"
    subprocess.run(["tmux", "new-session", "-d", "-s", "theirs", "sh", "-c", f'{PY} -c "$1" "$2"; sleep 600', "sh", WORKERS, str(pids)], check=True)
    pane = int(subprocess.run(["tmux", "list-panes", "-t", "=theirs:", "-F", "#{pane_pid}"], capture_output=True, text=True).stdout)
    await eventually(lambda: len(live_tree(pane)) == 4)  # sh, python, two workers
    plan = await kill.plan_kill(host, "theirs", smi=FAKE_SMI, nvml=False)
    assert plan.run_id is None and plan.pane_pids == (pane,) and plan.pids == sorted(live_tree(pane))
    report = await kill.kill_run(host, plan, grace_s=10, smi=FAKE_SMI, nvml=False)
    assert report.signalled == plan.pids
    assert not any(alive(p) for p in plan.pids)
    assert [r.session for r in await runs.list_runs(host)] == []


async def test_a_pid_whose_start_time_changed_after_the_plan_is_not_signalled_as_planned(host, tmux_dir, tmp_path):
    async def started_session(name: str) -> tuple[int, int]:
        out = tmp_path / name
        subprocess.run(["tmux", "new-session", "-d", "-s", name, PY, "-c", HUP_PROOF_CHILD, str(out)], check=True)
        line = await eventually(lambda: written(out).endswith("\n") and written(out))
        parent, child = map(int, line.split())
        return parent, child

    # Control: planned as it is, the child is signalled and ends with its parent.
    parent, child = await started_session("control")
    report = await kill.kill_run(host, await kill.plan_kill(host, "control", smi=FAKE_SMI, nvml=False), grace_s=10, smi=FAKE_SMI, nvml=False)
    assert child in report.signalled and not alive(child)

    # The same, with the child's pid recorded as another process's (as if reused since).
    parent, child = await started_session("reused")
    plan = await kill.plan_kill(host, "reused", smi=FAKE_SMI, nvml=False)
    assert child in plan.tree
    plan = dataclasses.replace(plan, tree={**plan.tree, child: plan.tree[child] + 1})
    try:
        report = await kill.kill_run(host, plan, grace_s=1, smi=FAKE_SMI, nvml=False)
        # No SIGTERM as planned; but it is still of the run's session, so the kill's reads
        # of the run's tree find it and stop it (SIGKILL: it ignores the hangup) before it
        # reports. A reused pid that is not the run's: tests/hostile/test_kill_bystander.py.
        assert report.signalled == sorted(set(plan.tree) - {child}) and child in report.killed
        assert not alive(parent) and not alive(child)
    finally:
        if alive(child):
            os.kill(child, 9)


def exits_on_enter(status: int) -> list[str]:
    """A command that lives until Enter is pressed in its pane, then exits `status` (a
    launch that ends at once is a failed launch)."""
    return [PY, "-c", f"import sys; sys.stdin.readline(); raise SystemExit({status})"]


def press_enter(session: str) -> None:
    subprocess.run(["tmux", "send-keys", "-t", f"={session}:", "Enter"], check=True)


async def test_a_run_that_already_ended_is_refused_naming_its_exit_status(host):
    info = await runs.launch(host, exits_on_enter(3))
    press_enter(info.session)
    await eventually(lambda: ended(host, info.run_id))
    with pytest.raises(kill.AlreadyEnded, match=rf"^{info.run_id} had already ended \(exit status 3\): nothing was stopped$"):
        await kill.plan_kill(host, info.run_id, smi=FAKE_SMI, nvml=False)
    assert info.session in subprocess.run(["tmux", "list-sessions", "-F", "#S"], capture_output=True, text=True).stdout  # untouched


async def test_a_run_ending_between_plan_and_signal_is_refused_untouched(host):
    info = await runs.launch(host, exits_on_enter(4))
    plan = await kill.plan_kill(host, info.run_id, smi=FAKE_SMI, nvml=False)
    press_enter(info.session)
    await eventually(lambda: ended(host, info.run_id))
    with pytest.raises(kill.AlreadyEnded, match="had already ended \\(exit status 4\\)"):
        await kill.kill_run(host, plan, smi=FAKE_SMI, nvml=False)


def test_the_cli_says_an_ended_run_had_ended_and_exits_1(capsys, config):
    assert cli(capsys, "launch", "--config", config, "--session", "short", "--", *exits_on_enter(7))[0] == 0
    press_enter("short")
    dead = ["tmux", "list-panes", "-t", "=short:", "-F", "#{pane_dead}"]
    asyncio.run(eventually(lambda: subprocess.run(dead, capture_output=True, text=True).stdout.strip() == "1"))
    code, out, err = cli(capsys, "kill", "short", "--config", config)
    assert code == 1 and out == ""
    assert err.strip() == "trackside: short had already ended (exit status 7): nothing was stopped"


def test_kill_on_a_host_without_gpus_says_what_is_true(capsys, config, tmp_path):
    no_gpu = tmp_path / "no-gpu.toml"
    no_gpu.write_text(Path(config).read_text().replace(FAKE_SMI, str(tmp_path / "absent-nvidia-smi")))
    assert cli(capsys, "launch", "--config", str(no_gpu), "--session", "cpu", "--", "sleep", "60")[0] == 0
    code, out, _ = cli(capsys, "kill", "cpu", "--config", str(no_gpu))
    assert code == 0 and out.splitlines()[-1] == "stopped; no nvidia-smi on this host: no GPU memory to verify"
    assert "released" not in out


@pytest.mark.slow
async def test_a_torchrun_run_is_signalled_exactly_as_planned_agent_and_workers(host, bystanders):
    torchrun = str(Path(PY).parent / "torchrun")
    info = await runs.launch(host, [
        "env", "OMP_NUM_THREADS=1", torchrun, "--standalone", "--nproc-per-node", "2", "-m", "training", "train",
        "--synthetic", "--device", "cpu", "--steps", "100000", "--max-seq-len", "128", "--ttt-steps", "1", "--save-every", "0",
    ])  # fmt: skip
    metrics = Path(info.run_dir, "metrics.jsonl")

    def training_on_two_ranks():
        # a run that ended before training fails now, with its console, not at the timeout
        assert not Path(info.run_dir, "exit_status").exists(), written(Path(info.run_dir, "console.log"))[-3000:]
        events = [json.loads(line) for line in written(metrics).splitlines(keepends=True) if line.endswith("\n")]
        return any(e["event"] == "step" for e in events) and events[0]["world_size"] == 2

    await eventually(training_on_two_ranks, timeout=180, interval=0.2)
    plan = await kill.plan_kill(host, info.run_id, smi=FAKE_SMI, nvml=False)
    tree = live_tree(info.pids[0])
    command = {p: Path(f"/proc/{p}/cmdline").read_text().split("\0") for p in tree}
    agent = [p for p, argv in command.items() if argv[1:2] == [torchrun]]
    workers = [p for p, argv in command.items() if "training" in argv and torchrun not in argv]
    assert len(agent) == 1 and len(workers) == 2, command
    assert set(plan.pids) == tree  # the recording sh, the agent and both workers

    assert list(plan.first) == sorted(workers)  # signalled first: the agent is left to see them end

    report = await kill.kill_run(host, plan, grace_s=60, smi=FAKE_SMI, nvml=False)
    assert report.signalled == sorted(workers) and report.killed == [], report
    assert not any(alive(p) for p in tree) and report.survivors == []
    assert all(alive(p) for p in bystanders)
    # (its checkpoint writer's `checkpoint` event may follow the end)
    end = [e for e in map(json.loads, written(metrics).splitlines()) if e["event"] == "end"][-1]
    assert end["status"] == "stopped"  # rank 0 stopped cleanly on SIGTERM
    # The agent saw its workers stop cleanly and exited 0 itself: the run's status is the truth.
    listed = next(r for r in await runs.list_runs(host) if r.run_id == info.run_id)
    assert (report.exit_status, listed.state, listed.exit_status, listed.end_status) == (0, runs.RunPhase.EXITED, 0, "stopped")


# A CUDA process that holds ~2 GiB until killed; prints "ready" once the memory is taken.
HOLD_GPU = """
import sys, time, torch
hold = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print("ready", flush=True)
time.sleep(600)
"""


@pytest.mark.gpu
async def test_on_a_real_gpu_the_plan_names_what_nvml_says_and_the_kill_frees_it(host, tmp_path):
    """The fake nvidia-smi's real twin: the plan's holdings and bystanders come from NVML,
    the kill signals the plan's PIDs, and NVML then shows the run's memory released while
    the bystander keeps its own."""
    bystander = subprocess.Popen([PY, "-c", HOLD_GPU], stdout=subprocess.PIPE, text=True)
    try:
        assert bystander.stdout.readline().strip() == "ready"
        info = await runs.launch(host, ["sh", "-c", f'{PY} -c "$1" > "$2"', "sh", HOLD_GPU, str(tmp_path / "out")])
        await eventually(lambda: "ready" in written(tmp_path / "out"), timeout=60)
        plan = await kill.plan_kill(host, info.run_id)
        assert plan.gpu_status == "OK", plan.gpu_message
        held = {p.pid: p for p in plan.holdings}
        assert held and set(held) <= set(plan.pids) and all(p.used_mib >= 2048 for p in held.values())
        assert bystander.pid in {p.pid for p in plan.bystanders} and bystander.pid not in plan.pids
        report = await kill.kill_run(host, plan, grace_s=10)
        assert report.signalled == plan.pids and report.released and not report.stragglers, report.verdict()
        assert bystander.poll() is None and bystander.pid in {p.pid for p in report.other_holders}
        print(f"real GPU kill: {len(plan.pids)} pids, {sum(p.used_mib for p in held.values())} MiB released "
              f"in {report.release_s:.3f} s after the last exit; {report.verdict()}")  # fmt: skip
    finally:
        bystander.kill()
        bystander.wait()
