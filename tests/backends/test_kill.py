"""Scoped kill over real tmux and real processes. GPU memory comes from the fake nvidia-smi
(this machine has no GPU; nvml=False keeps it so on a GPU box): it lists only live PIDs, as
a real driver frees a dead process's memory, so the release check sees what it would on a
card."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from backends import kill, procs, runs, tmux
from backends.gpu import GpuProcess
from backends.kill import KillError
from tests.backends.test_runs import PY, eventually, host, tmux_dir, written  # noqa: F401 (fixtures)
from training.handover import alive

FAKE_SMI = str(Path(__file__).resolve().parent.parent / "fake_nvidia_smi.py")

# A parent with two worker processes (one of which leaves the session with setsid, as
# some launchers' workers do); each prints its pid, then they all sleep.
WORKERS = """
import multiprocessing as mp, os, sys, time
def work(escape):
    if escape:
        os.setsid()
    time.sleep(600)
if __name__ == "__main__":
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=work, args=(i == 1,)) for i in range(2)]
    for p in procs:
        p.start()
    print("ready", os.getpid(), *[p.pid for p in procs], flush=True)
    time.sleep(600)
"""

IGNORES_TERM = """
import signal, os, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", os.getpid(), flush=True)
time.sleep(600)
"""

SAVES_ON_TERM = """
import signal, os, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
print("ready", os.getpid(), flush=True)
time.sleep(600)
"""


async def ready_pids(info) -> list[int]:
    """The pids the run printed on its `ready` line (its console.log)."""
    console = Path(info.run_dir, "console.log")
    # Only a complete line: pipe-pane may hand the log over in pieces.
    lines = lambda: written(console).splitlines(keepends=True)  # noqa: E731
    line = await eventually(lambda: next((ln for ln in lines() if ln.startswith("ready") and ln.endswith("\n")), None))
    return [int(p) for p in line.split()[1:]]


@pytest.fixture
def bystanders(tmux_dir):
    """A Python process in another tmux session and one outside tmux: neither may be hit."""
    outside = subprocess.Popen([PY, "-c", "import time; time.sleep(600)"])
    subprocess.run(["tmux", "new-session", "-d", "-s", "bystander", PY, "-c", "import time; time.sleep(600)"], check=True)
    pane = subprocess.run(["tmux", "list-panes", "-t", "=bystander:", "-F", "#{pane_pid}"], capture_output=True, text=True)
    pids = [outside.pid, int(pane.stdout.split()[0])]
    yield pids
    outside.kill()
    outside.wait()


@pytest.fixture
def gpu_procs(tmp_path, monkeypatch):
    """Declare which pids hold how much memory on which of two fake GPUs."""
    path = tmp_path / "gpu-procs.json"
    path.write_text("[]")
    monkeypatch.setenv("FAKE_NVIDIA_SMI_PROCS", str(path))
    monkeypatch.setenv("FAKE_NVIDIA_SMI_GPUS", "2")

    def declare(holders: dict[int, tuple[int, int]]) -> None:
        rows = [{"pid": pid, "gpu": g, "used_mib": mib, "name": "python3"} for pid, (g, mib) in holders.items()]
        path.write_text(json.dumps(rows))

    return declare


@pytest.mark.slow
async def test_kill_is_scoped_over_20_trials(host, bystanders, gpu_procs):
    harmed = 0
    for trial in range(20):
        # Not a test of the launch: no 2 s wait to see whether the pane dies at once.
        info = await runs.launch(host, [PY, "-c", WORKERS], startup_s=0)
        parent, *workers = await ready_pids(info)
        gpu_procs({parent: (0, 1000), workers[0]: (0, 2000), workers[1]: (1, 3000), bystanders[1]: (1, 500)})
        report = await kill.kill_run(host, info.run_id, grace_s=10, smi=FAKE_SMI, nvml=False)
        assert {parent, *workers} <= set(report.signalled), report
        assert not any(alive(p) for p in [parent, *workers]), f"trial {trial}: a run process survived"
        assert report.survivors == [] and report.killed == [] and report.released
        assert not set(report.signalled) & set(bystanders)
        harmed += sum(not alive(p) for p in bystanders)
    assert harmed == 0
    # The last report: the run's 6000 MiB came back, the bystander's 500 MiB is still held.
    assert sorted((p.pid, p.gpu_index, p.used_mib) for p in report.gpu_processes_before) == sorted(
        [(parent, 0, 1000), (workers[0], 0, 2000), (workers[1], 1, 3000)]
    )
    deltas = {g.index: (g.before_mib - g.after_mib) for g in report.gpus}
    assert deltas == {0: 3000, 1: 3000}
    assert report.other_holders == [GpuProcess(bystanders[1], 1, 500, "python3")]
    assert (await runs.list_runs(host))[-1].session == "bystander"


async def test_run_ignoring_sigterm_is_killed_after_the_grace_period(host, bystanders):
    info = await runs.launch(host, [PY, "-c", IGNORES_TERM])
    (pid,) = await ready_pids(info)
    started = time.monotonic()
    report = await kill.kill_run(host, info.run_id, grace_s=0.5, smi=FAKE_SMI, nvml=False)
    assert time.monotonic() - started >= 0.5
    # The run's python and the sh that records its status (which waits it out) both.
    assert pid in report.killed and report.killed == report.signalled and len(report.killed) == 2
    assert report.survivors == [] and not alive(pid)
    assert report.exit_status == -9 and all(alive(p) for p in bystanders)
    manifest = json.loads(Path(info.run_dir, "manifest.json").read_text())
    assert manifest["exit_status"] == 137 and manifest["ended"]  # as the shell records SIGKILL
    run = next(r for r in await runs.list_runs(host) if r.run_id == info.run_id)
    assert (run.state, run.exit_status) == (runs.RunPhase.EXITED, -9)


async def test_run_that_saves_on_sigterm_exits_cleanly_without_sigkill(host):
    info = await runs.launch(host, [PY, "-c", SAVES_ON_TERM])
    (pid,) = await ready_pids(info)
    report = await kill.kill_run(host, info.run_id, grace_s=10, smi=FAKE_SMI, nvml=False)
    assert pid in report.signalled and report.killed == [] and report.exit_status == 0
    assert report.seconds < 10  # it polled for the exit rather than waiting out the grace


async def test_kill_to_verified_release_latency(host, gpu_procs, capsys):
    info = await runs.launch(host, [PY, "-c", WORKERS])
    parent, *workers = await ready_pids(info)
    gpu_procs({parent: (0, 40000), workers[0]: (0, 35000), workers[1]: (1, 75000)})
    report = await kill.kill_run(host, info.run_id, grace_s=10, smi=FAKE_SMI, nvml=False)
    assert report.released and report.stragglers == [] and report.release_s is not None
    assert {(g.index, g.before_mib - g.after_mib) for g in report.gpus} == {(0, 75000), (1, 75000)}
    with capsys.disabled():
        print(f"\nkill-to-verified: last exit → GPU memory released in {report.release_s * 1000:.0f} ms (whole kill {report.seconds:.2f} s)")


async def test_a_process_outside_the_run_holding_memory_is_named_not_touched(host, bystanders, gpu_procs):
    info = await runs.launch(host, [PY, "-c", WORKERS])
    parent, *workers = await ready_pids(info)
    gpu_procs({workers[0]: (0, 4000), workers[1]: (1, 4000), bystanders[0]: (1, 2048)})
    report = await kill.kill_run(host, info.run_id, grace_s=10, smi=FAKE_SMI, nvml=False)
    assert report.released and report.stragglers == []  # released speaks of the run only
    assert report.other_holders == [GpuProcess(bystanders[0], 1, 2048, "python3")]
    assert bystanders[0] not in report.signalled and alive(bystanders[0])
    assert {g.index: g.before_mib - g.after_mib for g in report.gpus} == {0: 4000, 1: 4000}


async def test_kill_by_session_name_covers_sessions_we_did_not_launch(host, tmux_dir):
    subprocess.run(["tmux", "new-session", "-d", "-s", "theirs", PY, "-c", WORKERS], check=True)
    panes = subprocess.run(["tmux", "list-panes", "-t", "=theirs:", "-F", "#{pane_pid}"], capture_output=True, text=True)
    pane_pid = int(panes.stdout.split()[0])

    def tree() -> list[int]:
        children = [int(p) for p in Path(f"/proc/{pane_pid}/task/{pane_pid}/children").read_text().split()]
        return children if len(children) == 2 else []

    workers = await eventually(tree)
    report = await kill.kill_run(host, "theirs", grace_s=10, smi=FAKE_SMI, nvml=False)
    assert report.run_id is None and set(report.signalled) >= {pane_pid, *workers}
    assert not any(alive(p) for p in [pane_pid, *workers])
    assert [r.session for r in await runs.list_runs(host)] == []


async def test_unknown_targets_are_refused(host):
    with pytest.raises(KillError, match="no run or tmux session 'nope'"):
        await kill.kill_run(host, "nope", smi=FAKE_SMI, nvml=False)
    with pytest.raises(runs.RunError, match="no run 20260101-0000-abcd"):
        await kill.kill_run(host, "20260101-0000-abcd", smi=FAKE_SMI, nvml=False)


def test_process_tree_takes_session_group_and_descendants_only():
    P = procs.Proc
    table = {
        p.pid: p
        for p in [
            P(100, 1, 100, 100, False, "t"),  # the pane process
            P(101, 100, 101, 100, False, "t"),  # own group, same session
            P(102, 101, 102, 102, False, "t"),  # left the session: a descendant still
            P(103, 102, 102, 102, True, "t"),  # a zombie: nothing to signal
            P(200, 1, 200, 200, False, "t"),  # another session
            P(201, 200, 100, 200, False, "t"),  # odd, but in the run's process group
        ]
    }
    pane = tmux.Pane("s", 100, False, None)
    assert procs.process_tree(table, [pane]) == {100, 101, 102, 201}
    # A dead pane whose pid now belongs to someone else anchors nothing.
    dead = tmux.Pane("s", 200, True, 0)
    assert procs.process_tree(table, [dead]) == set()
    assert procs.ancestry(table, 103) == {103, 102, 101, 100}


async def test_a_job_typed_at_an_interactive_shell_stops_and_the_shell_and_its_session_stay(host, tmux_dir):
    subprocess.run(["tmux", "new-session", "-d", "-s", "typed", "-x", "80", "-y", "24", "bash", "--norc", "--noprofile", "-i"], check=True)
    job = f"{PY} -c 'import time; print(\"training\", flush=True); time.sleep(600)'"
    subprocess.run(["tmux", "send-keys", "-t", "=typed:", job, "Enter"], check=True)
    panes = subprocess.run(["tmux", "list-panes", "-t", "=typed:", "-F", "#{pane_pid}"], capture_output=True, text=True)
    shell = int(panes.stdout.split()[0])

    def the_job() -> list[int]:
        return [int(p) for p in Path(f"/proc/{shell}/task/{shell}/children").read_text().split()]

    [child] = await eventually(the_job)
    started = time.monotonic()
    report = await kill.kill_run(host, "typed", grace_s=20, smi=FAKE_SMI, nvml=False)
    # The job took its SIGTERM: nothing waited out the grace for the shell, which ignores it.
    assert time.monotonic() - started < 10 and report.killed == []
    assert child in report.signalled and shell not in report.signalled
    assert not alive(child) and alive(shell)
    screen = subprocess.run(["tmux", "capture-pane", "-p", "-t", "=typed:"], capture_output=True, text=True).stdout
    assert "training" in screen  # the session, and its scrollback with the run's output, stay
    assert any("shell" in note and "stay open" in note for note in report.notes)


# A launcher named torchrun (its basename is what the plan looks for) starting two workers,
# each a program of its own as torchrun's are.
FAKE_TORCHRUN = """#!{python}
import subprocess, sys, time
workers = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]) for _ in range(2)]
print("ready", *[w.pid for w in workers], flush=True)
time.sleep(600)
"""


async def test_torchrun_is_recognised_whatever_the_terminals_width(host, tmux_dir, tmp_path, monkeypatch):
    """ps cuts its command lines to $COLUMNS: with COLUMNS=80 and a long venv path the
    torchrun agent was not recognised, and its workers not signalled first."""
    venv = tmp_path / ("a-long-virtualenv-path-" * 6) / "bin"
    venv.mkdir(parents=True)
    launcher = venv / "torchrun"
    launcher.write_text(FAKE_TORCHRUN.format(python=PY))
    launcher.chmod(0o755)
    subprocess.run(["tmux", "new-session", "-d", "-s", "dist", str(launcher), "--nproc-per-node", "2", "train.py"], check=True)
    pane = int(subprocess.run(["tmux", "list-panes", "-t", "=dist:", "-F", "#{pane_pid}"], capture_output=True, text=True).stdout)

    def workers() -> list[int]:
        found = [int(p) for p in Path(f"/proc/{pane}/task/{pane}/children").read_text().split()]
        return found if len(found) == 2 else []

    expected = await eventually(workers)
    monkeypatch.setenv("COLUMNS", "80")
    plan = await kill.plan_kill(host, "dist", smi=FAKE_SMI, nvml=False)
    assert sorted(plan.first) == sorted(expected)


async def test_the_run_of_a_session_is_the_pane_holding_gpu_memory(host, tmux_dir, gpu_procs):
    """Window 0 prints a loss the pane reads; window 1's trainer holds the GPU: the run is
    window 1's pane, though its text gives no step."""
    from backends import gpu

    subprocess.run(["tmux", "new-session", "-d", "-s", "split", "sh", "-c", "echo step=5 loss=9.9; exec sleep 600"], check=True)
    subprocess.run(["tmux", "new-window", "-t", "=split:", PY, "-c", "import time; print('warming up', flush=True); time.sleep(600)"], check=True)
    panes = {p.where: p for p in await tmux.list_panes(host, "split")}
    trainer = await eventually(lambda: [int(c) for c in Path(f"/proc/{panes['1.0'].pid}/task/{panes['1.0'].pid}/children").read_text().split()] or [panes["1.0"].pid])
    gpu_procs({trainer[0]: (0, 4000)})

    async def held() -> set[int]:
        return {p.pid for p in (await gpu.read_gpus(host, FAKE_SMI, nvml=False)).processes}

    [run] = [r for r in await runs.list_runs(host, gpu_pids=held) if r.session == "split"]
    assert run.pane == "1.0" and run.last_step is None
    [run] = [r for r in await runs.list_runs(host) if r.session == "split"]  # no GPU reading: the text decides
    assert run.pane == "0.0" and run.last_step == 5
