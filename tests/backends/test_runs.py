"""Runs in real tmux: launch, list, relaunch. Each test gets its own tmux server
(TMUX_TMPDIR per test), so no test sees or touches another's sessions, or the user's."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from backends import runs, tmux
from backends.hosts import LocalHost
from backends.relaunch import Relaunch, relaunch
from backends.runs import RunPhase
from backends.runs.rundir import epoch
from scripts.local_box import end_tmux_server
from tests.waiting import HANG_S, niced, trainer_started
from training.contract import WRITING_MARKER

PY = sys.executable
TRAIN = niced([PY, "-m", "training", "train", "--synthetic", "--max-seq-len", "128", "--ttt-steps", "2"])


@pytest.fixture
def tmux_dir(monkeypatch):
    # Short and under /tmp: tmux's socket path must stay within 107 bytes.
    directory = tempfile.mkdtemp(prefix="ts-tmux-", dir="/tmp")
    monkeypatch.setenv("TMUX_TMPDIR", directory)
    monkeypatch.delenv("TMUX", raising=False)
    yield directory
    end_tmux_server("tmux")  # this test's server only (TMUX_TMPDIR)
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def host(tmux_dir, runs_root):
    return LocalHost(runs_root=runs_root)


async def eventually(check, timeout: float = 10.0, interval: float = 0.05):
    """Poll a check (plain or async) until it returns something truthy; fail after timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(interval)


async def run_named(host, run_id):
    return next(r for r in await runs.list_runs(host) if r.run_id == run_id)


async def ended(host, run_id):
    run = await run_named(host, run_id)
    return run if run.state is not RunPhase.RUNNING else None


def written(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def argv_echo(out: Path) -> list[str]:
    """A command that writes the argv it received as JSON to `out`, then lingers."""
    script = "import json,sys,time; open(sys.argv[1],'w').write(json.dumps(sys.argv[2:])); time.sleep(30)"
    return [PY, "-c", script, str(out)]


HOSTILE = ["8192; touch {pwned}", "$(touch {pwned})", "`touch {pwned}`", "a\nb", "it's", '"q"', "--out", "*", ""]


def test_a_manifests_time_is_read_in_its_one_form_only():
    assert epoch("2027-01-15T08:00:00Z") == 1_800_000_000
    # what strptime alone would take, and what a hostile manifest holds instead of a string
    assert [epoch(t) for t in ("2027-1-15T8:0:0Z", " 2027-01-15T08:00:00Z", "2027-01-15T08:00:00", None, 1e9, ["x"])] == [None] * 6


async def test_argv_arrives_literally_and_nothing_is_executed(host, tmp_path):
    pwned = tmp_path / "pwned"
    hostile = [s.format(pwned=pwned) for s in HOSTILE]
    out = tmp_path / "argv.json"
    await runs.launch(host, argv_echo(out) + hostile)
    assert json.loads(await eventually(lambda: written(out))) == hostile
    assert not pwned.exists()


async def test_launch_writes_manifest_and_console_and_list_follows_state(host):
    script = "import sys,time\nfor i in range(3): print(f'line {i}', flush=True)\ntime.sleep(0.5)\nsys.exit(7)"
    info = await runs.launch(host, [PY, "-c", script], session="ts-test-state", startup_s=0)
    assert info.state is RunPhase.RUNNING and info.session == "ts-test-state"
    assert runs.RUN_ID.fullmatch(info.run_id) and info.run_dir.endswith(info.run_id)
    manifest = json.loads(Path(info.run_dir, "manifest.json").read_text())
    assert manifest["argv"] == [PY, "-c", script] and manifest["pane_pid"] == info.pids[0]
    assert manifest["session"] == "ts-test-state" and manifest["ended"] is None

    listed = await run_named(host, info.run_id)
    assert listed.state is RunPhase.RUNNING and listed.pids == info.pids

    done = await eventually(lambda: ended(host, info.run_id))
    assert done.exit_status == 7 and done.pids == []
    # pipe-pane's `cat` may still be writing as the pane dies: wait for it, no longer.
    console = Path(info.run_dir, "console.log")
    await eventually(lambda: written(console).split() == ["line", "0", "line", "1", "line", "2"], timeout=5)
    manifest = json.loads(Path(info.run_dir, "manifest.json").read_text())
    assert manifest["exit_status"] == 7 and manifest["ended"]


async def test_a_command_that_exits_at_once_still_leaves_its_status(host):
    # remain-on-exit is set in the same tmux invocation, so even `false` keeps its pane.
    info = await runs.launch(host, ["false"], startup_s=0)
    done = await eventually(lambda: ended(host, info.run_id))
    assert (done.state, done.exit_status) == (RunPhase.EXITED, 1)
    assert [p.dead for p in await tmux.list_panes(host, info.session)] == [True]


async def test_a_pane_that_dies_in_its_first_seconds_is_a_failed_launch(host):
    script = "import sys; print('bad flag: --frobnicate', flush=True); sys.exit(2)"
    started = time.monotonic()
    with pytest.raises(runs.RunError) as failed:
        await runs.launch(host, [PY, "-c", script], session="dies")
    assert time.monotonic() - started < runs.STARTUP_S  # polled: it did not wait the window out
    message = str(failed.value)
    assert f"{PY} exited with status 2 within 2s of its launch" in message and "| bad flag: --frobnicate" in message
    # Kept, to be read: the run reads as exited 2 with its console.
    [run] = [r for r in await runs.list_runs(host) if r.session == "dies"]
    assert (run.state, run.exit_status) == (RunPhase.EXITED, 2)
    assert "bad flag" in Path(run.run_dir, "console.log").read_text()
    with pytest.raises(runs.RunError, match=r"^/\S*/sh was killed by signal 15 within 2s"):
        await runs.launch(host, ["sh", "-c", "kill -TERM $$"])


async def test_a_clean_exit_and_a_live_pane_are_launches_that_worked(host):
    quick = await runs.launch(host, ["true"])
    assert (quick.state, quick.exit_status, quick.pids) == (RunPhase.EXITED, 0, [])
    started = time.monotonic()
    alive = await runs.launch(host, ["sleep", "30"])
    assert alive.state is RunPhase.RUNNING and time.monotonic() - started >= runs.STARTUP_S


async def test_a_trainer_that_dies_after_its_first_seconds_before_its_start_event_failed_to_start(host, tmp_path):
    """As the trainer refusing `--block-size` without `--drafter dflash` once it has loaded,
    seconds after its launch: past the 2 s in which a launch was judged, it read as started
    (issue 32, item 3)."""
    refuses = stand_in_trainer(tmp_path, "refuses", "time.sleep(4); print('--block-size needs --drafter dflash', flush=True); sys.exit(2)")
    with pytest.raises(runs.RunError) as failed:
        await runs.launch(host, [*refuses, "--synthetic"], train_command=refuses, session="refused")
    message = str(failed.value)
    assert re.search(r"exited with status 2 [4-9]\.\ds after its launch, before its start event: run \S+ failed to start", message), message
    assert "| --block-size needs --drafter dflash" in message
    [run] = [r for r in await runs.list_runs(host) if r.session == "refused"]
    assert (run.state, run.exit_status) == (RunPhase.EXITED, 2)
    # The real trainer's refusal, however long it loads first.
    with pytest.raises(runs.RunError, match=r"(?s)exited with status 2 .*before its start event.*--block-size needs --drafter dflash"):
        await runs.launch(host, [*TRAIN, "--block-size", "16"])


async def test_a_launch_says_how_it_was_judged(host, tmp_path):
    loads = stand_in_trainer(tmp_path, "loads", "time.sleep(3); start(); time.sleep(30)")
    info = await runs.launch(host, loads, train_command=loads)
    assert info.state is RunPhase.RUNNING and info.pids
    after = re.fullmatch(r"started: its start event came (\d+\.\d)s after its launch", info.judged)
    assert after and float(after[1]) >= 3, info.judged
    assert info.to_json() == {**runs.RunInfo(**{k: v for k, v in vars(info).items() if k not in ("judged", "session_note")}).to_json(), "judged": info.judged}
    never = stand_in_trainer(tmp_path, "never", "time.sleep(30)")
    info = await runs.launch(host, never, train_command=never, start_wait_s=3)
    assert info.state is RunPhase.RUNNING and info.judged == "still loading after 3s: no start event yet, not judged"
    info = await runs.launch(host, ["sleep", "30"])
    assert info.judged == "alive after 2s (no start event waited for)"
    assert (await runs.launch(host, ["true"])).judged.startswith("ended with exit status 0 ")


async def test_the_real_trainer_is_judged_by_its_start_event(host):
    # Waited for as long as a hang would take: the launch's own minute is not a torch import's at load 10.
    info = await runs.launch(host, [*TRAIN, "--steps", "100000"], start_wait_s=HANG_S)
    assert info.state is RunPhase.RUNNING and info.judged.startswith("started: its start event came "), info.judged
    first = Path(info.run_dir, "metrics.jsonl").read_text().splitlines()[0]
    assert json.loads(first)["event"] == "start"


async def test_every_run_gets_its_exit_status(host):
    """tmux 3.3 shows some dead panes without a status; the recorded one never misses."""
    infos = [await runs.launch(host, [PY, "-c", f"import sys; sys.exit({n})"], startup_s=0) for n in range(10)]
    infos.append(await runs.launch(host, ["sh", "-c", "kill -TERM $$"], startup_s=0))

    async def all_ended():
        listed = {r.run_id: r for r in await runs.list_runs(host)}
        return all(listed[i.run_id].state is not RunPhase.RUNNING for i in infos) and listed

    listed = await eventually(all_ended)
    assert [listed[i.run_id].exit_status for i in infos] == [*range(10), -15]
    assert listed[infos[3].run_id].state is RunPhase.EXITED  # 3 is OOM only for the trainer


async def test_capture_pane_shows_what_the_run_printed(host):
    info = await runs.launch(host, [PY, "-c", "print('hello from the pane', flush=True); import time; time.sleep(30)"])
    screen = await eventually(lambda: _captured(host, info.session))
    assert "hello from the pane" in screen
    with pytest.raises(tmux.TmuxError, match="can't find"):
        await tmux.capture_pane(host, "no-such-session")


async def _captured(host, session):
    screen = await tmux.capture_pane(host, session)
    return screen if "hello" in screen else None


async def test_a_host_may_ask_for_a_dedicated_tmux_socket(host):
    host.tmux_socket = "trackside-test"
    try:
        info = await runs.launch(host, ["sleep", "30"])
        on_socket = subprocess.run(["tmux", "-L", "trackside-test", "list-sessions", "-F", "#{session_name}"], capture_output=True, text=True)
        assert on_socket.stdout.split() == [info.session]
        default = subprocess.run(["tmux", "list-sessions"], capture_output=True, text=True)
        assert info.session not in default.stdout
        assert [r.session for r in await runs.list_runs(host)] == [info.session]
    finally:
        subprocess.run(["tmux", "-L", "trackside-test", "kill-server"], capture_output=True)


async def test_foreign_sessions_are_listed_without_run_id(host):
    subprocess.run(["tmux", "new-session", "-d", "-s", "someone-else", "sleep", "30"], check=True)
    mine = await runs.launch(host, ["sleep", "30"])
    listed = await runs.list_runs(host)
    foreign = [r for r in listed if r.run_id is None]
    assert [r.session for r in foreign] == ["someone-else"]
    assert foreign[0].state is RunPhase.RUNNING and len(foreign[0].pids) == 1
    assert [r.run_id for r in listed if r.run_id] == [mine.run_id]
    assert await tmux.list_sessions(host) == sorted(["someone-else", mine.session])


async def test_metrics_tail_gives_step_loss_and_oom(host):
    info = await runs.launch(host, ["sleep", "30"])
    events = [
        {"event": "start", "steps_per_epoch": 40, "config": {}},
        *({"event": "step", "step": s, "loss": 5.0 - s / 10} for s in range(1, 200)),
        {"event": "oom", "max_seq_len": 32768, "ttt_steps": 3},
    ]
    Path(info.run_dir, "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events) + '{"event": "st')
    run = await run_named(host, info.run_id)
    assert (run.last_step, run.last_loss, run.steps_per_epoch) == (199, pytest.approx(5.0 - 19.9), 40)
    assert run.state is RunPhase.RUNNING  # the pane is alive: an oom event alone does not end it
    tmux_kill = subprocess.run(["tmux", "kill-session", "-t", f"={info.session}"])
    assert tmux_kill.returncode == 0
    assert (await run_named(host, info.run_id)).state is RunPhase.OOM


async def test_the_trainers_end_is_listed_beside_the_launchers_exit_code(host):
    # What torchrun leaves after a clean stop: the workers wrote `end stopped`, it exits 1.
    info = await runs.launch(host, ["sh", "-c", "sleep 0.5; exit 1"], startup_s=0)
    lines = [{"event": "start", "config": {}}, {"event": "end", "status": "stopped"}]
    Path(info.run_dir, "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    done = await eventually(lambda: ended(host, info.run_id))
    assert (done.state, done.exit_status, done.end_status) == (RunPhase.EXITED, 1, "stopped")
    assert runs.launcher_code(done.end_status, done.exit_status)
    # a resume starts again: the earlier end no longer holds
    lines.append({"event": "start", "config": {"resumed_from_step": 2}})
    Path(info.run_dir, "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    again = await run_named(host, info.run_id)
    assert again.end_status is None and not runs.launcher_code(again.end_status, again.exit_status)
    assert not runs.launcher_code("failed", 1) and not runs.launcher_code("completed", 0)


async def test_session_names_are_checked_and_duplicates_refused(host):
    with pytest.raises(ValueError, match="session name"):
        await runs.launch(host, ["true"], session="a:b")
    first = await runs.launch(host, ["sleep", "30"], session="dup")
    with pytest.raises(tmux.TmuxError, match="duplicate session"):
        await runs.launch(host, ["sleep", "30"], session="dup")
    assert [r.run_id for r in await runs.list_runs(host)] == [first.run_id]


def stand_in_trainer(tmp_path: Path, name: str, body: str) -> list[str]:
    """A program launched as the host's train command: given `--out RUN_DIR`, it runs `body`,
    where `start()` writes the start event to the run dir's metrics.jsonl, as the trainer
    does once it has loaded and begun training."""
    script = tmp_path / f"{name}.py"
    head = """\
        import json, sys, time
        out = sys.argv[sys.argv.index("--out") + 1]
        def start():
            with open(out + "/metrics.jsonl", "a") as metrics:
                metrics.write(json.dumps({"event": "start", "time": time.time(), "config": {}, "steps_per_epoch": None, "world_size": 1}) + "\\n")
        """
    script.write_text(textwrap.dedent(head) + textwrap.dedent(body))
    return [PY, str(script)]


def alone(host, train_command=None) -> tuple[dict, dict]:
    """The fleet of one host a relaunch reaches, and its train command."""
    return {host.name: host}, {host.name: train_command}


def fake_trainer(tmp_path: Path) -> list[str]:
    """A stand-in train command for the argv plumbing: records the argv it was given,
    starts, then lingers."""
    return stand_in_trainer(tmp_path, "trainer", 'open(out + "/argv.json", "w").write(json.dumps(sys.argv[1:])); start(); time.sleep(30)')


async def test_trainer_argv_gets_out_params_and_relaunch_links_parent(host, tmp_path):
    train = fake_trainer(tmp_path)
    first = await runs.launch(host, train + ["--synthetic", "--ttt-steps", "3", "--lr=1e-4"], train_command=train)
    assert first.params == {"ttt_steps": 3, "lr": 1e-4}
    argv_file = Path(first.run_dir, "argv.json")
    assert json.loads(await eventually(lambda: written(argv_file))) == ["--synthetic", "--ttt-steps", "3", "--lr=0.0001", "--out", first.run_dir]

    with pytest.raises(runs.RunError, match="no checkpoint"):
        await relaunch(Relaunch(host.name, first.run_id, resume=True), *alone(host, train))
    # Still stopping (R started as the SIGTERM goes out): the checkpoint its stop saves
    # comes after this launch, so none is looked for; the trainer waits for the run and
    # its writer, and refuses to start if there is still none.
    stopping, _ = await relaunch(Relaunch(host.name, first.run_id, resume=True, after_pids=[os.getpid()]), *alone(host, train))
    argv = json.loads(await eventually(lambda: written(Path(stopping.run_dir, "argv.json"))))
    assert argv[argv.index("--resume-from") + 1] == f"{first.run_dir}/checkpoints"
    assert argv[argv.index("--after-pids") + 1] == str(os.getpid())
    # A checkpoint still being made durable (its writer's marker) is one to resume from:
    # the trainer waits for it, so the relaunch need not.
    checkpoints = Path(first.run_dir, "checkpoints")
    checkpoints.mkdir()
    (checkpoints / WRITING_MARKER).write_text('{"pid": 1, "step": 10}')

    started = []  # told as soon as its session exists, before its start is judged
    asked = Relaunch(host.name, first.run_id, {"ttt_steps": 5, "max_seq_len": 16384}, resume=True)
    second, _ = await relaunch(asked, *alone(host, train), on_started=started.append)
    assert [(s.run_id, s.state, s.parent) for s in started] == [(second.run_id, RunPhase.RUNNING, first.run_id)]
    assert second.parent == first.run_id and second.run_id != first.run_id
    assert second.params == {"ttt_steps": 5, "lr": 1e-4, "max_seq_len": 16384}
    argv_file = Path(second.run_dir, "argv.json")
    assert json.loads(await eventually(lambda: written(argv_file))) == [
        "--synthetic", "--ttt-steps", "5", "--lr=0.0001", "--max-seq-len", "16384",
        "--resume-from", str(checkpoints), "--out", second.run_dir,
    ]  # fmt: skip
    listed = await run_named(host, second.run_id)
    assert listed.parent == first.run_id and listed.params["ttt_steps"] == 5

    # A bare flag and a step count: switched on, then off again, by a relaunch.
    changes = {"freeze_lm_head": True, "checkpoint_ttt": 2}
    third, _ = await relaunch(Relaunch(host.name, second.run_id, changes), *alone(host, train))
    assert third.params == {**second.params, **changes}
    argv = json.loads(await eventually(lambda: written(Path(third.run_dir, "argv.json"))))
    assert argv.count("--freeze-lm-head") == 1 and argv.count("--checkpoint-ttt") == 1
    assert "--resume-from" not in argv  # resumes only when asked, from its own parent
    assert argv[argv.index("--checkpoint-ttt") + 1] == "2"
    changes = {"freeze_lm_head": False, "checkpoint_ttt": 0}
    fourth, _ = await relaunch(Relaunch(host.name, third.run_id, changes), *alone(host, train))
    argv = json.loads(await eventually(lambda: written(Path(fourth.run_dir, "argv.json"))))
    assert "--checkpoint-ttt" not in argv and "--freeze-lm-head" not in argv
    assert fourth.params["checkpoint_ttt"] == 0 and fourth.params["freeze_lm_head"] is False


def test_launch_command_maps_trackside_train_to_the_hosts_train_command():
    command = runs.launch_command(["trackside", "train", "--synthetic"], {"ttt_steps": 4}, "/r/x", ["/opt/py", "-m", "training", "train"])
    assert command == ["/opt/py", "-m", "training", "train", "--synthetic", "--ttt-steps", "4", "--out", "/r/x"]
    assert runs.launch_command(["sleep", "5"], {}, "/r/x", None) == ["sleep", "5"]
    assert runs.train_args_start(["python3", "-m", "training", "train", "--steps", "3"]) == 4


async def test_relaunch_refuses_unknown_runs_and_non_trainer_runs(host):
    with pytest.raises(runs.RunError, match="not a run id"):
        await relaunch(Relaunch(host.name, "../../etc"), *alone(host))
    with pytest.raises(runs.RunError, match="no run"):
        await relaunch(Relaunch(host.name, "20260101-0000-abcd"), *alone(host))
    plain = await runs.launch(host, ["sleep", "30"])
    with pytest.raises(runs.RunError, match="not a trainer run"):
        await relaunch(Relaunch(host.name, plain.run_id, {"ttt_steps": 5}), *alone(host))


def fake_trackside(tmp_path: Path) -> Path:
    """An executable named `trackside` that, as `trackside train`, records its argv in its
    --out dir (the trainer's part of the contract that launch relies on), then lingers."""
    path = tmp_path / "bin" / "trackside"
    path.parent.mkdir()
    path.write_text(f"#!{PY}\n" + Path(fake_trainer(tmp_path)[1]).read_text())
    path.chmod(0o755)
    return path


@pytest.mark.parametrize(
    "argv, start",
    [
        (["trackside", "train", "--steps", "3"], 2),
        ([".venv/bin/trackside", "train"], 2),
        (["/opt/venv/bin/trackside", "train", "--synthetic"], 2),
        (["python3", "-m", "training", "train"], 4),
        (["trackside", "extract"], None),
        (["not-trackside", "train"], None),
        (["/bin/sh", "-c", "trackside train"], None),
    ],
)
def test_the_trainer_is_recognised_by_what_it_runs(argv, start):
    assert runs.train_args_start(argv) == start


async def test_a_path_to_trackside_train_is_a_trainer_run(host, tmp_path, runs_root):
    trackside = fake_trackside(tmp_path)
    info = await runs.launch(host, [str(trackside), "train", "--synthetic", "--ttt-steps", "3"])
    assert info.params == {"ttt_steps": 3}
    argv = json.loads(await eventually(lambda: written(Path(info.run_dir, "argv.json"))))
    assert argv == ["train", "--synthetic", "--ttt-steps", "3", "--out", info.run_dir]
    assert json.loads(Path(info.run_dir, "manifest.json").read_text())["trainer"] is True
    assert [p.name for p in Path(runs_root).iterdir()] == [info.run_id]  # no second run dir


async def test_the_program_is_run_by_the_path_the_launchers_path_gives_it(host, tmp_path, monkeypatch):
    trackside = fake_trackside(tmp_path)
    monkeypatch.setenv("PATH", f"{trackside.parent}:{os.environ['PATH']}")
    info = await runs.launch(host, ["trackside", "train", "--synthetic"])
    argv = json.loads(await eventually(lambda: written(Path(info.run_dir, "argv.json"))))
    assert argv[-2:] == ["--out", info.run_dir]
    assert json.loads(Path(info.run_dir, "manifest.json").read_text())["command"][0] == str(trackside)
    # Not on any PATH: the pane dies at once, and the launch says so.
    with pytest.raises(runs.RunError, match=r"(?s)no-such-program exited with status 127 within 2s.*not found"):
        await runs.launch(host, ["no-such-program", "train"])


async def test_trackside_is_found_beside_this_python_when_its_venv_is_not_activated(host, monkeypatch):
    """`.venv/bin/trackside launch -- trackside train …` from a shell whose PATH lacks the venv."""
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    info = await runs.launch(host, ["trackside", "train", "--help"])  # prints its usage, exits 0
    assert info.exit_status == 0
    manifest = json.loads(Path(info.run_dir, "manifest.json").read_text())
    assert manifest["command"] == [str(Path(PY).parent / "trackside"), "train", "--help", "--out", info.run_dir]
    assert "usage:" in await eventually(lambda: written(Path(info.run_dir, "console.log")))


async def test_over_ssh_the_program_is_looked_up_on_the_host(ssh_host, tmp_path):
    found = await runs.resolve_program(ssh_host, ["sh", "-c", "true"])
    assert found[0].startswith("/") and found[0].endswith("/sh") and found[1:] == ["-c", "true"]
    pwned = tmp_path / "pwned"
    for word in ["no-such-program", f"$(touch {pwned})", f"x; touch {pwned}"]:
        assert await runs.resolve_program(ssh_host, [word, "a"]) == [word, "a"]
    assert not pwned.exists()


HF_LINES = [f"{{'loss': {3 - i / 100:.4f}, 'grad_norm': 0.5, 'learning_rate': 1e-05, 'epoch': {i / 100:.2f}}}" for i in range(1, 201)]


async def test_foreign_sessions_carry_what_their_panes_printed(host, tmp_path):
    # ~200 HF Trainer dicts in the scrollback, its bar below them.
    script = tmp_path / "hf.txt"
    script.write_text("\n".join(HF_LINES) + "\n 20%|██        | 2000/10000 [10:00<40:00,  3.33it/s]\n")
    subprocess.run(["tmux", "new-session", "-d", "-s", "hf", "sh", "-c", f"cat {script}; sleep 600"], check=True)
    subprocess.run(["tmux", "new-session", "-d", "-s", "quiet", "sleep", "600"], check=True)
    mine = await runs.launch(host, ["sh", "-c", "echo step=5 loss=9.0; sleep 30"])

    async def printed():
        listed = {r.session: r for r in await runs.list_runs(host)}
        return listed if listed["hf"].last_step is not None else None

    listed = await eventually(printed)
    hf = listed["hf"]
    assert (hf.last_step, hf.last_loss) == (2000, 1.0)
    assert json.loads(json.dumps(hf.to_json()))["progress"] == {
        "phase": "training", "done": 2000, "total": 10000, "eta_s": 2400.0, "label": "", "kind": "tqdm", "epoch": None, "epochs": None, "epoch_from": None,
    }  # fmt: skip
    assert (listed["quiet"].last_step, listed["quiet"].last_loss, listed["quiet"].progress) == (None, None, None)
    # A run of ours that writes no metrics is read from its console.log, as its screen reads it.
    assert (listed[mine.session].last_step, listed[mine.session].last_loss) == (5, 9.0)


@pytest.mark.slow
async def test_the_listing_carries_the_pace_and_tau_the_dashboard_shows(host):
    """`trackside runs --json` is the fleet row's twin: a live DFlash run's tokens/s, τ and
    ETA, the ETA reckoned as the dashboard reckons it from the same step events."""
    from tui.state import RunState as Shown

    argv = niced([PY, "-m", "training", "train", "--synthetic", "--drafter", "dflash", "--steps", "5000",
                  "--max-seq-len", "128", "--block-size", "4", "--max-anchors", "8"])  # fmt: skip
    info = await runs.launch(host, argv, startup_s=0)
    await eventually(lambda: trainer_started(info.run_dir), HANG_S)

    async def live():
        listed = next(r for r in await runs.list_runs(host) if r.run_id == info.run_id)
        return listed if listed.state is RunPhase.RUNNING and (listed.last_step or 0) >= 5 else None

    listed = await eventually(live, timeout=90, interval=0.3)
    assert listed.tokens_per_s > 0 and 0.0 <= listed.tau <= 4.0 and listed.eta_s > 0
    doc = listed.to_json()
    assert {"tokens_per_s", "tau", "eta_s"} <= doc.keys()
    with open(os.path.join(listed.run_dir, "metrics.jsonl")) as metrics:
        events = [json.loads(line) for line in metrics]
    shown = Shown(f"local/{info.run_id}", "local", listed)
    for event in events[: next(i for i, e in enumerate(events) if e.get("step") == listed.last_step) + 1]:
        shown.add_event(event)
    assert shown.tau == listed.tau and shown.tokens_per_s == listed.tokens_per_s
    assert shown.eta_s() == pytest.approx(listed.eta_s)


def test_a_garbled_metrics_file_never_fails_the_listing():
    """metrics.jsonl is the trainer's, or anyone's garbage: a start whose config is a list,
    a step of null, a resume point written as text. The fold takes them and says less."""
    from backends.logs.record import MetricsRecord

    record = MetricsRecord(64)
    for event in [
        {"event": "start", "config": [1]},
        {"event": "step", "step": None, "time": 1.0},
        {"event": "start", "config": {"resumed_from_step": "3", "steps": "x"}},
        {"event": "step", "step": 4, "time": 2.0, "loss": "nan"},
        {"event": "start", "config": {"resumed_from_step": 2}},
    ]:
        record.add(event)
    assert record.eta_s({"steps": "10"}) is None and record.value("loss") is None and record.config == {"resumed_from_step": 2}
