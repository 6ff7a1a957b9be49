"""The whole cycle over a real OpenSSH sshd with the real trainer on CPU: launch a run,
stream its metrics, kill it (it checkpoints on SIGTERM), relaunch it with a deeper TTT
resuming from that checkpoint, and read the new run's metrics."""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest

from backends import kill, procs, runs, tmux
from backends.logs import streams
from backends.relaunch import Relaunch, relaunch
from backends.runs import RunPhase
from tests.backends.test_kill import FAKE_SMI
from tests.backends.test_runs import HOSTILE, alone, argv_echo, eventually, tmux_dir, written  # noqa: F401 (fixture)

TRAIN = ["trackside", "train", "--synthetic", "--steps", "100000", "--save-every", "1000", "--max-seq-len", "256"]


async def metrics_until(host, run_dir: str, enough, timeout: float = 120.0) -> list[dict]:
    """Follow the run's metrics.jsonl over the host until `enough(events)` holds."""

    async def collect() -> list[dict]:
        events: list[dict] = []
        async with contextlib.aclosing(streams.follow(host, f"{run_dir}/metrics.jsonl")) as lines:
            async for line in lines:
                events.append(json.loads(line.text))
                if enough(events):
                    return events
        raise AssertionError(f"metrics ended early: {events}")

    return await asyncio.wait_for(collect(), timeout)


def steps(events: list[dict]) -> list[dict]:
    return [e for e in events if e["event"] == "step"]


@pytest.fixture
async def remote(sshd, runs_root, tmux_dir, tmp_path):
    """An SSHHost whose commands see this test's tmux server and fake GPU processes.

    The prefix is the host setting a container would use (`pct exec 129 --`); here it
    sets the environment of every remote command instead.
    """
    gpu_procs = tmp_path / "gpu-procs.json"
    gpu_procs.write_text("[]")
    env = ["env", f"TMUX_TMPDIR={tmux_dir}", f"FAKE_NVIDIA_SMI_PROCS={gpu_procs}"]
    host = sshd.host(prefix=env, runs_root=runs_root)
    yield host, gpu_procs
    await host.close()


async def test_hostile_argv_arrives_literally_over_ssh(remote, tmp_path):
    remote, _ = remote
    pwned = tmp_path / "pwned"
    hostile = [s.format(pwned=pwned) for s in HOSTILE]
    out = tmp_path / "argv.json"
    info = await runs.launch(remote, argv_echo(out) + hostile)
    assert json.loads(await eventually(lambda: written(out))) == hostile
    assert not pwned.exists()
    report = await kill.kill_run(remote, info.session, grace_s=10, smi=FAKE_SMI)
    assert report.run_id == info.run_id and report.released


@pytest.mark.slow
async def test_launch_stream_kill_relaunch_over_ssh(remote):
    remote, gpu_procs = remote
    first = await runs.launch(remote, TRAIN + ["--ttt-steps", "3"])
    events = await metrics_until(remote, first.run_dir, lambda ev: len(steps(ev)) >= 2)
    assert events[0]["event"] == "start" and events[0]["config"]["ttt_steps"] == 3
    assert all(len(e["loss_ttt"]) == 3 for e in steps(events))

    panes = await tmux.list_panes(remote, first.session)
    (trainer,) = procs.process_tree(await procs.process_table(remote), panes) - {panes[0].pid}
    gpu_procs.write_text(json.dumps([{"pid": trainer, "gpu": 0, "used_mib": 4096}]))
    report = await kill.kill_run(remote, first.run_id, grace_s=60, smi=FAKE_SMI)
    # The trainer checkpoints on SIGTERM and exits 0 well within the grace period.
    assert report.killed == [] and report.survivors == [] and report.exit_status == 0
    assert [(p.pid, p.used_mib) for p in report.gpu_processes_before] == [(trainer, 4096)]
    assert report.released and report.stragglers == []
    print(f"\nover SSH: kill took {report.seconds:.2f}s, GPU release verified {report.release_s * 1000:.0f} ms after the last exit")

    killed = next(r for r in await runs.list_runs(remote) if r.run_id == first.run_id)
    assert (killed.state, killed.exit_status) == (RunPhase.EXITED, 0) and killed.last_step >= 2

    second, _ = await relaunch(Relaunch(remote.name, first.run_id, {"ttt_steps": 5}, resume=True), *alone(remote))
    assert second.parent == first.run_id and second.params["ttt_steps"] == 5
    events = await metrics_until(remote, second.run_dir, lambda ev: len(steps(ev)) >= 2)
    start = events[0]
    assert start["event"] == "start" and start["config"]["ttt_steps"] == 5
    assert start["config"]["resumed_from_step"] >= killed.last_step
    assert all(len(e["loss_ttt"]) == 5 for e in steps(events))
    assert steps(events)[0]["step"] == start["config"]["resumed_from_step"] + 1

    listed = {r.run_id: r for r in await runs.list_runs(remote) if r.run_id}
    assert listed[second.run_id].state is RunPhase.RUNNING and listed[second.run_id].parent == first.run_id
    report = await kill.kill_run(remote, second.run_id, grace_s=60, smi=FAKE_SMI)
    assert report.exit_status == 0 and report.released
