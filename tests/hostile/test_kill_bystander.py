"""No bystander, ever: the kill tried as an attacker would, on real processes in real tmux,
here and over the loopback sshd. A run that forks during the grace period, a pid reused
within the second, pids that are not the pane's (put into the plan, or forged as a pane's
pid), a dashboard or sshd that dies between SIGTERM and SIGKILL."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from backends import kill, procs, runs, tmux
from backends.hosts import LocalHost
from backends.runs.status import describe
from tests.backends.test_kill import FAKE_SMI, alive, ready_pids
from tests.backends.test_runs import PY, eventually, host, tmux_dir, written  # noqa: F401 (fixtures)

HERE = Path(__file__).resolve().parent
TRACKSIDE = str(Path(PY).parent / "trackside")
INTERRUPTED = re.compile(r"stop interrupted: SIGTERM at \d\d:\d\d, (\d+) process(?:es)? still alive")

# On SIGTERM: ten sleepers that ignore TERM and HUP (inherited through exec), orphaned at
# once (the sh that forks them exits), then the run exits 0. Only the run's session still
# names them as the run's.
FORKS_ON_TERM = """
import os, signal, subprocess, sys, time
def on_term(*_):
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    forked = subprocess.run(["sh", "-c", "for i in 1 2 3 4 5 6 7 8 9 10; do sleep 600 >/dev/null 2>&1 & echo $!; done"],
                            capture_output=True, text=True).stdout
    open(sys.argv[1] + ".tmp", "w").write(forked)
    os.rename(sys.argv[1] + ".tmp", sys.argv[1])
    os._exit(0)
signal.signal(signal.SIGTERM, on_term)
print("ready", os.getpid(), flush=True)
time.sleep(600)
"""

# Notes each SIGTERM in a file and runs on, hangups ignored (its pane's end): a stop needs SIGKILL.
NOTES_TERM = """
import os, signal, sys, time
signal.signal(signal.SIGHUP, signal.SIG_IGN)
signal.signal(signal.SIGTERM, lambda *_: open(sys.argv[1], "a").write("TERM\\n"))
print("ready", os.getpid(), flush=True)
while True:
    time.sleep(600)
"""

# A worker that leaves the session with setsid but still descends (caught), and one that
# double-forks out of it, reparented to init (no longer the run's: left alone).
ESCAPES = """
import os, sys, time
def detach(double):
    if os.fork():
        return
    os.setsid()
    if double and os.fork():
        os._exit(0)
    open(sys.argv[1] + ("escaped" if double else "setsid"), "w").write(str(os.getpid()))
    time.sleep(600)
detach(False)
detach(True)
print("ready", os.getpid(), flush=True)
time.sleep(600)
"""


@pytest.fixture(params=["local", "ssh"])
async def where(request, tmux_dir, runs_root):
    """The host the attack runs on: this machine, or this machine over the loopback sshd."""
    if request.param == "local":
        yield LocalHost(runs_root=runs_root)
        return
    sshd = request.getfixturevalue("sshd")
    if not sshd.running:
        sshd.start()
    host = sshd.host(prefix=["env", f"TMUX_TMPDIR={tmux_dir}"], runs_root=runs_root)
    yield host
    await host.close()


@pytest.fixture
def outsiders(tmux_dir):
    """A process outside tmux and one in another tmux session: neither is any run's."""
    outside = subprocess.Popen(["sleep", "600"])
    subprocess.run(["tmux", "new-session", "-d", "-s", "bystander", "sleep", "600"], check=True)
    pane = subprocess.run(["tmux", "list-panes", "-t", "=bystander:", "-F", "#{pane_pid}"], capture_output=True, text=True)
    yield [outside.pid, int(pane.stdout.split()[0])]
    outside.kill()
    outside.wait()


def end(pids) -> None:
    """What an attack left running (the pids it wrote itself), so no test leaks it."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


async def test_processes_forked_in_the_grace_period_end_before_it_says_stopped(where, tmp_path):
    forked = tmp_path / "forked"
    info = await runs.launch(where, [PY, "-c", FORKS_ON_TERM, str(forked)])
    await ready_pids(info)
    sleepers: list[int] = []
    try:
        report = await kill.kill_run(where, info.run_id, grace_s=2, smi=FAKE_SMI, nvml=False)
        sleepers = [int(p) for p in written(forked).split()]
        assert len(sleepers) == 10
        # At the report, not eventually: it says stopped only once the tree is empty.
        assert [p for p in sleepers if alive(p)] == [], report
        assert set(sleepers) <= set(report.killed) and report.survivors == []
    finally:
        end(sleepers)


def unshare_works() -> bool:
    try:
        return subprocess.run(["unshare", "-pf", "--mount-proc", "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.skipif(not unshare_works(), reason="needs `unshare -pf --mount-proc` (root): a pid namespace to reuse a pid in")
def test_a_pid_reused_within_the_second_is_not_signalled(tmp_path):
    # In a pid namespace of its own (pid_reuse.py is its init), so that ns_last_pid gives
    # the ended process's pid to the next fork, a bystander, within the same second.
    runs_root = tmp_path / "runs"
    runs_root.mkdir()
    env = {**os.environ, "TMUX_TMPDIR": str(tmp_path)}
    env.pop("TMUX", None)
    done = subprocess.run(["unshare", "-pf", "--mount-proc", PY, str(HERE / "pid_reuse.py"), str(runs_root)],
                          capture_output=True, text=True, env=env, timeout=240)  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    if result.get("skipped"):
        pytest.skip(result["skipped"])
    assert result["in_plan"] and result["same_second"] and result["reused"]
    assert result["bystander_alive"] and not result["signalled"], result


async def test_a_pid_put_into_the_plan_is_not_signalled(where, outsiders, tmp_path):
    info = await runs.launch(where, [PY, "-c", NOTES_TERM, str(tmp_path / "term")])
    (pid,) = await ready_pids(info)
    plan = await kill.plan_kill(where, info.run_id, smi=FAKE_SMI, nvml=False)
    table = await procs.process_table(where)
    # As the plan names its own: each pid with its identity, read right now.
    forged = dataclasses.replace(plan, tree={**plan.tree, **{p: table[p].started for p in outsiders}})
    report = await kill.kill_run(where, forged, grace_s=1, smi=FAKE_SMI, nvml=False)
    assert not set(outsiders) & {*report.signalled, *report.killed}, report
    assert all(alive(p) for p in outsiders) and not alive(pid)


async def test_a_forged_pane_pid_is_no_root(where, outsiders, tmp_path, monkeypatch):
    info = await runs.launch(where, [PY, "-c", NOTES_TERM, str(tmp_path / "term")])
    (pid,) = await ready_pids(info)
    listed = tmux.list_panes

    async def forging(host, session=None):
        """tmux's records as a process forging them would have them read: pid 1 (over SSH
        it put 130 of ~200 processes in the plan) and another session's pane as panes of
        the run's session."""
        panes = await listed(host, session)
        ours = [p for p in panes if p.session == info.session]
        extra = [dataclasses.replace(ours[0], pid=p, pane_id=f"%9{i}") for i, p in enumerate([1, outsiders[1]])] if ours else []
        return panes + extra

    monkeypatch.setattr(tmux, "list_panes", forging)
    for target in (info.run_id, info.session):
        plan = await kill.plan_kill(where, target, smi=FAKE_SMI, nvml=False)
        assert 1 not in plan.tree and not set(outsiders) & set(plan.tree), plan.tree
        assert pid in plan.tree and len(plan.tree) == 2  # the run and the sh recording its status
    report = await kill.kill_run(where, plan, grace_s=1, smi=FAKE_SMI, nvml=False)
    assert all(alive(p) for p in outsiders) and not alive(pid) and len(report.killed) == 2


async def test_a_worker_that_left_the_tree_is_left_alone_one_that_descends_is_not(where, tmp_path):
    info = await runs.launch(where, [PY, "-c", ESCAPES, f"{tmp_path}/"])
    await ready_pids(info)
    setsid = int(await eventually(lambda: written(tmp_path / "setsid")))
    escaped = int(await eventually(lambda: written(tmp_path / "escaped")))
    try:
        plan = await kill.plan_kill(where, info.run_id, smi=FAKE_SMI, nvml=False)
        assert setsid in plan.tree and escaped not in plan.tree
        await kill.kill_run(where, plan, grace_s=5, smi=FAKE_SMI, nvml=False)
        assert not alive(setsid) and alive(escaped)
    finally:
        end([escaped])


async def test_a_planted_journal_is_never_written_through(host, tmp_path):
    info = await runs.launch(host, [PY, "-c", NOTES_TERM, str(tmp_path / "term")])
    await ready_pids(info)
    victim = tmp_path / "victim"
    victim.write_text("root's own\n")
    Path(info.run_dir, "kill.json").symlink_to(victim)
    report = await kill.kill_run(host, info.run_id, grace_s=1, smi=FAKE_SMI, nvml=False)
    # Refused, not followed: the kill goes on (a stop must not wait on a journal) and says so.
    assert victim.read_text() == "root's own\n" and report.killed and not any(alive(p) for p in report.killed)
    assert any("journal" in note and "symbolic link" in note for note in report.notes), report.notes
    # Where nothing is planted: this user's alone, closed, each signal in it.
    info = await runs.launch(host, [PY, "-c", NOTES_TERM, str(tmp_path / "term")])
    await ready_pids(info)
    report = await kill.kill_run(host, info.run_id, grace_s=1, smi=FAKE_SMI, nvml=False)
    journal = Path(info.run_dir, "kill.json")
    assert journal.stat().st_mode & 0o777 == 0o600 and json.loads(journal.read_text())["closed"]
    assert [s["signal"] for s in json.loads(journal.read_text())["signals"]] == ["TERM", "KILL"] and report.killed


async def test_a_process_name_that_looks_like_a_record_is_read_as_a_name(where, tmp_path):
    # Its name (comm, 15 bytes) holds ') ', a newline and what a stat line's fields look
    # like: read up to its first ')' or line by line, its parent would be pid 1.
    name = "x) S 1 1 1\n2 ("
    program = tmp_path / name
    shutil.copy("/bin/sleep", program)
    named = subprocess.Popen([str(program), "600"])
    try:
        await eventually(lambda: Path(f"/proc/{named.pid}/comm").read_text() == name + "\n")
        started = int(Path(f"/proc/{named.pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        table = await procs.process_table(where)
        assert table[named.pid] == procs.Proc(named.pid, os.getpid(), os.getpgid(0), os.getsid(0), False, started, name)
    finally:
        named.kill()
        named.wait()


def trackside(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([TRACKSIDE, *argv], capture_output=True, text=True, timeout=timeout)


def config_file(tmp_path: Path, runs_root: str) -> str:
    path = tmp_path / "config.toml"
    path.write_text(f"[hosts.box]\nruns_root = {json.dumps(runs_root)}\nnvidia_smi = {json.dumps(FAKE_SMI)}\n")
    return str(path)


def listed(config: str, session: str) -> tuple[str, dict]:
    """`trackside runs`' row of the session, in its table and in its JSON."""
    text, doc = trackside("runs", "--config", config), trackside("runs", "--config", config, "--json")
    assert text.returncode == 0 and doc.returncode == 0, text.stderr + doc.stderr
    row = next(line for line in text.stdout.splitlines() if f" {session} " in f" {line} ")
    return row, next(r for r in json.loads(doc.stdout) if r["session"] == session)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["run", "foreign-session", "run-whose-pane-ended"])
async def test_a_kill_killed_after_sigterm_is_shown_interrupted_and_kill_finishes_it(tmp_path, runs_root, tmux_dir, kind):
    config, marker = config_file(tmp_path, runs_root), tmp_path / "term"
    foreign = kind == "foreign-session"
    if foreign:  # a session trackside did not launch: no run dir holds its journal
        subprocess.run(["tmux", "new-session", "-d", "-s", "theirs", PY, "-c", NOTES_TERM, str(marker)], check=True)
        target = session = "theirs"
        processes = 1
    else:
        # The run's sh ends on SIGTERM, and the sh recording its status with it: the pane
        # is dead, and only the journal still knows the python the sh left behind.
        command = ["sh", "-c", '"$0" -c "$1" "$2" & wait', PY, NOTES_TERM, str(marker)] if kind == "run-whose-pane-ended" else [PY, "-c", NOTES_TERM, str(marker)]
        launched = trackside("launch", "--config", config, "--host", "box", "--json", "--", *command)
        assert launched.returncode == 0, launched.stderr
        target, session = json.loads(launched.stdout)["run_id"], json.loads(launched.stdout)["session"]
        processes = 1 if kind == "run-whose-pane-ended" else 2  # and the sh recording its status
    await eventually(lambda: subprocess.run(["tmux", "capture-pane", "-p", "-t", f"={session}:"], capture_output=True, text=True).stdout.startswith("ready"), timeout=60)
    stopping = subprocess.Popen([TRACKSIDE, "kill", target, "--config", config, "--grace", "300"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        await eventually(lambda: "TERM" in written(marker), timeout=120)
    finally:
        stopping.send_signal(signal.SIGKILL)  # the dashboard or CLI, gone right after SIGTERM
        stopping.wait()
    row, doc = listed(config, session)
    assert (m := INTERRUPTED.search(row)) and int(m[1]) == processes, row
    assert INTERRUPTED.fullmatch(doc["status"]) and doc["stop"]["signal"] == "TERM" and doc["stop"]["alive"] == processes, doc

    finished = trackside("kill", target, "--config", config, "--grace", "1")
    assert finished.returncode == 0, finished.stdout + finished.stderr
    row, doc = listed(config, session) if not foreign else (None, None)
    assert row is None or ("interrupted" not in row and doc["stop"] is None)
    assert "SIGKILL" in finished.stdout


async def test_sshd_gone_mid_kill_leaves_a_stop_the_next_listing_shows(fresh_sshd, runs_root, tmux_dir, tmp_path):
    prefix = ["env", f"TMUX_TMPDIR={tmux_dir}"]
    host, marker = fresh_sshd.host(prefix=prefix, runs_root=runs_root), tmp_path / "term"
    info = await runs.launch(host, [PY, "-c", NOTES_TERM, str(marker)])
    (pid,) = await ready_pids(info)
    stopping = asyncio.create_task(kill.kill_run(host, info.run_id, grace_s=300, smi=FAKE_SMI))
    await eventually(lambda: "TERM" in written(marker), timeout=60)
    fresh_sshd.sever()
    with pytest.raises(Exception):
        await asyncio.wait_for(stopping, 60)
    await host.close()
    again = fresh_sshd.host(prefix=prefix, runs_root=runs_root)
    try:
        run = next(r for r in await runs.list_runs(again) if r.run_id == info.run_id)
        assert (m := INTERRUPTED.fullmatch(describe(run))) and int(m[1]) == 2, describe(run)
        report = await kill.kill_run(again, info.run_id, grace_s=1, smi=FAKE_SMI)
        assert pid in report.killed and not alive(pid)
        run = next(r for r in await runs.list_runs(again) if r.run_id == info.run_id)
        assert "interrupted" not in describe(run)
    finally:
        await again.close()


def test_the_fleet_row_of_an_interrupted_stop_says_so_with_the_key_that_finishes_it():
    from tui.screens.fleet import run_cells
    from tui.state import HostState, RunState

    stop = {"signal": "TERM", "time": 1_700_000_000.0, "alive": 3}
    info = runs.RunInfo("20261204-1203-abcd", "ts-20261204-1203-abcd", "box", runs.RunPhase.RUNNING, pids=[7], stop=stop)
    cell = str(run_cells(RunState("box/r", "box", info), HostState("box"))["state"])
    assert INTERRUPTED.match(cell) and int(INTERRUPTED.match(cell)[1]) == 3 and cell.endswith("k finishes it"), cell
