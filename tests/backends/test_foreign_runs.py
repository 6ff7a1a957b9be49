"""The real `trackside` command against sessions it did not launch, one per trainer's way
of printing, and against launches that fail in their first seconds.

Each session is a real tmux session on this test's own server (TMUX_TMPDIR), printing a
trainer's lines and then idling, as a run would between log lines.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

import pytest

from backends import tmux
from backends.hosts import LocalHost
from backends.logs import panes, recording
from tests.backends.test_runs import PY, fake_trackside, tmux_dir  # noqa: F401 (fixture)

REPO = Path(__file__).resolve().parents[2]
TRACKSIDE = str(Path(PY).parent / "trackside")
RED, GREEN, PLAIN = "\x1b[31m", "\x1b[32m", "\x1b[39m"

# session: (lines it prints, last_step, last_loss, progress's (label or phase, done, total))
FORMATS = {
    "speculators": (
        [f"train/loss_0={2 - i / 100:.3f}, train/full_acc_0=0.512, train/loss_1=2.5, epoch=0, lr=1.00e-04" for i in range(1, 31)],
        None, 1.7, None,  # it prints no step: none is shown
    ),
    "hf": (
        [f"{{'loss': {3 - i / 100:.4f}, 'grad_norm': 0.51, 'learning_rate': 1e-05, 'epoch': {i / 100:.2f}}}" for i in range(1, 201)]
        + [" 20%|██        | 2000/10000 [10:00<40:00,  3.33it/s]"],
        2000, 1.0, ("training", 2000, 10000),  # a bare bar below loss lines counts the training
    ),
    "lightning": (
        [
            "Epoch 0: 100%|██████████| 1000/1000 [00:30<00:00, 15.00it/s, v_num=0, train_loss=2.310]",
            "Epoch 1: 100%|██████████| 1000/1000 [00:30<00:00, 15.00it/s, v_num=0, train_loss=2.000]",
            "Epoch 2:  45%|████▌     | 450/1000 [00:30<00:36, 15.00it/s, v_num=0, train_loss=1.900]",
        ],
        2450, 1.9, ("Epoch 2", 450, 1000),
    ),
    "nanogpt": (
        ["step 0: train loss 10.9, val loss 10.9"]
        + [f"iter {i}: loss {3 - i / 1000:.4f}, time 12.3ms, mfu 3.21%" for i in range(0, 2000, 10)],
        1990, 1.01, None,
    ),
    "torchtitan": (
        [f"{RED}step: {i:2d}  {GREEN}loss: {7 - i / 100:7.4f}  {PLAIN}memory: 12.34GiB(15.6%)  tps: 1,234  mfu: 31.2%" for i in range(1, 101)],
        100, 6.0, None,
    ),
    "jsonl": ([json.dumps({"step": i, "loss": round(1 / i, 4), "lr": 1e-4}) for i in range(1, 51)], 50, 0.02, None),
}


@pytest.fixture
def config(tmp_path, runs_root, tmux_dir):  # noqa: F811
    path = tmp_path / "config.toml"
    path.write_text(f"[hosts.box]\nruns_root = {json.dumps(runs_root)}\n")
    return str(path)


def trackside(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "tui.cli", *argv], capture_output=True, text=True, cwd=REPO, env=env, timeout=120)


def start_session(tmp_path: Path, name: str, lines: list[str]) -> None:
    printed = tmp_path / f"{name}.txt"
    printed.write_text("".join(line + "\n" for line in lines))
    subprocess.run(["tmux", "new-session", "-d", "-s", name, "sh", "-c", 'cat "$1"; sleep 600', "sh", str(printed)], check=True)


def test_runs_json_reads_every_trainers_console(config, tmp_path):
    for name, (lines, *_) in FORMATS.items():
        start_session(tmp_path, name, lines)
    done = trackside("runs", "--json", "--config", config)
    assert done.returncode == 0, done.stderr
    listed = {run["session"]: run for run in json.loads(done.stdout)}
    for name, (_, step, loss, progress) in FORMATS.items():
        run = listed[name]
        assert run["run_id"] is None and run["state"] == "running"
        assert (run["last_step"], run["last_loss"]) == (step, pytest.approx(loss)), name
        shown = run["progress"] and (run["progress"]["label"] or run["progress"]["phase"], run["progress"]["done"], run["progress"]["total"])
        assert shown == progress, name

    table = trackside("runs", "--config", config).stdout
    row = {line.split()[1]: line for line in table.splitlines()[1:]}
    assert "2450 (Epoch 2 450/1000, ETA 0:00:36)" in row["lightning"] and "1.9" in row["lightning"]
    assert "2000 (training 2000/10000, ETA 0:40:00)" in row["hf"]


def test_a_session_printing_nothing_of_the_kind_has_no_numbers(config, tmp_path):
    start_session(tmp_path, "shell", ["$ ls", "README.md  pyproject.toml", "loss went down a lot today", "3/4 of the way"])
    [run] = json.loads(trackside("runs", "--json", "--config", config).stdout)
    assert (run["last_step"], run["last_loss"], run["progress"]) == (None, None, None)


def test_launch_trackside_train_works_with_its_venv_not_activated(config, runs_root):
    env = {**os.environ, "PATH": "/usr/bin:/bin"}  # the venv's bin is not on it
    done = subprocess.run([TRACKSIDE, "launch", "--config", config, "--session", "x", "--", "trackside", "train", "--help"],
                          capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "launched" in done.stdout
    [run_dir] = Path(runs_root).iterdir()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["command"][0] == TRACKSIDE and manifest["trainer"] is True


def test_launch_by_a_path_to_trackside_is_the_trainer(config, runs_root, tmp_path):
    fake = fake_trackside(tmp_path)  # records the argv it got, as `trackside train` would use it
    done = trackside("launch", "--json", "--config", config, "--", str(fake), "train", "--synthetic", "--ttt-steps", "3")
    assert done.returncode == 0, done.stderr
    launched = json.loads(done.stdout)
    manifest = json.loads(Path(launched["run_dir"], "manifest.json").read_text())
    assert manifest["trainer"] is True and manifest["params"] == {"ttt_steps": 3}
    assert manifest["command"][-2:] == ["--out", launched["run_dir"]]
    assert [p.name for p in Path(runs_root).iterdir()] == [launched["run_id"]]


def test_a_launch_whose_pane_dies_at_once_exits_1_with_its_last_lines(config):
    done = trackside("launch", "--config", config, "--session", "dies", "--", "sh", "-c", "echo 'no such file: data/' >&2; exit 5")
    assert done.returncode == 1 and done.stdout == "" and "Traceback" not in done.stderr
    assert "exited with status 5 within 2s of its launch" in done.stderr and "| no such file: data/" in done.stderr
    missing = trackside("launch", "--config", config, "--", "no-such-trainer", "--steps", "3")
    assert missing.returncode == 1 and "exited with status 127" in missing.stderr and "not found" in missing.stderr


def test_the_runs_root_variable_is_one_rule_for_every_command(tmp_path, tmux_dir, monkeypatch):  # noqa: F811
    """$TRACKSIDE_RUNS_ROOT moves this machine's runs root for the trainer, `launch`,
    `runs`, `plot`, `kill` and the dashboard alike, where no config names one."""
    root = tmp_path / "elsewhere"
    env = {**os.environ, "TRACKSIDE_RUNS_ROOT": str(root), "HOME": str(tmp_path / "home")}
    launched = trackside("launch", "--json", "--", "sh", "-c", "echo step=1 loss=2.5; sleep 60", env=env)
    assert launched.returncode == 0, launched.stderr
    run = json.loads(launched.stdout)
    assert run["run_dir"].startswith(str(root))
    listed = json.loads(trackside("runs", "--json", env=env).stdout)
    assert [r["run_id"] for r in listed if r["run_id"]] == [run["run_id"]]
    plotted = trackside("plot", run["run_id"], "--json", env=env)
    assert plotted.returncode == 0 and json.loads(plotted.stdout)[0]["points"] == [[1, 2.5]], plotted.stderr
    stopped = trackside("kill", run["run_id"], "--json", env=env)
    assert stopped.returncode == 0, stopped.stderr
    from backends.config import parse_config

    monkeypatch.setenv("TRACKSIDE_RUNS_ROOT", str(root))
    assert parse_config({}).hosts[0].runs_root == str(root)  # the dashboard's, with no config
    assert parse_config({"hosts": {"box": {}}}).hosts[0].runs_root == str(root)  # a local host that names none
    assert parse_config({"hosts": {"box": {"runs_root": "/data/runs"}}}).hosts[0].runs_root == "/data/runs"


async def test_a_recording_turns_over_and_every_line_is_read_once_in_order(tmux_dir, runs_root, monkeypatch):  # noqa: F811
    """A pane printing past a segment's size: its recording moves to `.1` and starts again;
    a reader following it across each turn reads every line once, in order, whether it
    reads often or seldom."""
    # Two turns over 400 lines; the slow reader reads every ~0.8 s, a quarter of a segment
    # (a reader slower than a whole segment loses the lines of the segment no longer kept:
    # on a loaded CI machine, every 1.5 s of 4 KiB segments was once slower than that).
    monkeypatch.setattr(recording, "SEGMENT_BYTES", 6144)
    host = LocalHost(runs_root=runs_root)
    subprocess.run(["tmux", "new-session", "-d", "-s", "chatty", "sh", "-c",
                    'sleep 1; i=0; while [ $i -lt 400 ]; do i=$((i+1)); echo "step=$i loss=1.5 padding-to-forty"; sleep 0.02; done; sleep 600'],
                   check=True)  # fmt: skip
    # One reader keeps up; another reads seldom, after the live file has turned and grown
    # past where it had read the old one.
    reader, slow = panes.Recordings(), panes.Recordings()
    for i in range(400):
        [read] = (await reader.read(host, await tmux.list_panes(host))).values()
        if i % 8 == 0 or read.summary.step == 400:
            [late] = (await slow.read(host, await tmux.list_panes(host))).values()
        if read.summary.step == 400 and late.summary.step == 400:
            break
        await asyncio.sleep(0.1)
    assert [s for s, _ in read.summary.curve] == list(range(1, 401))
    assert [s for s, _ in late.summary.curve] == list(range(1, 401))
    # A reader that comes later (trackside runs, a dashboard started since) reads both
    # segments kept, the older first: the last steps, contiguous.
    [later] = (await panes.Recordings().read(host, await tmux.list_panes(host), drain=True)).values()
    steps = [s for s, _ in later.summary.curve]
    live = Path(next(Path(runs_root, "panes").rglob("0.log"))).read_text().count("step=")
    assert steps == list(range(steps[0], 401)) and len(steps) > live
    logs = sorted(p.name for p in Path(runs_root, "panes").rglob("*.log*"))
    assert logs == ["0.log", "0.log.1"]  # 400 lines of 42 bytes: more than two segments of 6 KiB, two kept
    assert all(p.stat().st_size <= recording.SEGMENT_BYTES for p in Path(runs_root, "panes").rglob("*.log*"))




async def test_a_reader_slower_than_a_whole_segment_says_its_lines_are_whole_only_since_the_loss(tmux_dir, runs_root, monkeypatch):  # noqa: F811
    """A reader that comes back after the recording turned twice: the segment it had not
    read is gone, and it says so: its lines are whole only from the end of the older
    segment kept (`since` moves there), never from the recording's start."""
    monkeypatch.setattr(recording, "SEGMENT_BYTES", 4096)
    host = LocalHost(runs_root=runs_root)
    subprocess.run(["tmux", "new-session", "-d", "-s", "flood", "sh", "-c",
                    'sleep 1; echo "step=0 loss=2.0"; sleep 3; i=0; while [ $i -lt 400 ]; do i=$((i+1)); echo "step=$i loss=1.5 padding-to-forty"; done; sleep 600'],
                   check=True)  # fmt: skip
    reader = panes.Recordings()
    first = None
    for _ in range(50):  # read until the first line is in: the reader follows the live file
        [first] = (await reader.read(host, await tmux.list_panes(host))).values()
        if first.summary.step == 0:
            break
        await asyncio.sleep(0.1)
    began = first.since
    assert began is not None and first.summary.step == 0
    done = Path(runs_root, "panes")
    for _ in range(100):  # the flood: 400 lines of 42 bytes, four segments of 4 KiB
        logs = list(done.rglob("0.log"))
        if logs and b"step=400 " in logs[0].read_bytes():
            break
        await asyncio.sleep(0.1)
    await asyncio.sleep(1.1)  # a later mtime than the recording's start, to the second
    [after] = (await reader.read(host, await tmux.list_panes(host), drain=True)).values()
    steps = [s for s, _ in after.summary.curve]
    assert steps[0] == 0 and steps[-1] == 400 and steps[1] > 1  # a segment's lines are gone
    assert after.since is not None and after.since > began


def test_every_pane_is_read_and_the_run_is_the_pane_whose_text_gives_steps(config, tmp_path):
    """A trainer in window 0 while the user looks at window 2: the run is window 0's pane,
    named as such."""
    start_session(tmp_path, "multi", [f"iter {i}: loss {3 - i / 100:.4f}, time 12.3ms, mfu 3.21%" for i in range(50)])
    subprocess.run(["tmux", "new-window", "-t", "=multi:", "sleep", "600"], check=True)
    subprocess.run(["tmux", "new-window", "-t", "=multi:", "sleep", "600"], check=True)  # window 2, the active one
    [run] = [r for r in json.loads(trackside("runs", "--json", "--config", config).stdout) if r["session"] == "multi"]
    assert (run["last_step"], run["last_loss"], run["pane"]) == (49, pytest.approx(2.51), "0.0")
    assert run["status"] == "running" and run["recorded_since"] is not None


async def test_a_session_named_like_a_tmux_format_is_recorded_and_runs_nothing(tmux_dir, runs_root, tmp_path):  # noqa: F811
    """tmux expands `#(…)` and `%…` in a pipe-pane command: a foreign session's name and the
    runs root reach it as text, never as a command or a date."""
    pwned = tmp_path / "pwned"
    name = f"a##(touch {pwned})b%d"  # tmux makes `##` one `#`: the session is named a#(touch …)b%d
    subprocess.run(["tmux", "new-session", "-d", "-s", name, "sh", "-c", "sleep 1; echo step=7 loss=1.5; sleep 600"], check=True)
    host = LocalHost(runs_root=runs_root)
    reader = panes.Recordings()
    for _ in range(50):
        [read] = (await reader.read(host, await tmux.list_panes(host))).values()
        if read.summary.step == 7:
            break
        await asyncio.sleep(0.1)
    assert read.pane.session == f"a#(touch {pwned})b%d"
    assert read.summary.step == 7 and read.since is not None  # recorded, and read from the recording
    assert not pwned.exists()


async def test_a_bar_drawn_whole_is_read_before_its_next_redraw(tmux_dir, runs_root):  # noqa: F811
    """A step that takes minutes: its bar, drawn whole, is the pane's state until the next
    redraw; the fold reads it now."""
    subprocess.run(["tmux", "new-session", "-d", "-s", "slow", "sh", "-c",
                    r"""sleep 1; printf '\r 5%%|▌    | 51/1000 [01:00<18:00,  1.0s/it, loss=2.5]'; sleep 600"""], check=True)  # fmt: skip
    host = LocalHost(runs_root=runs_root)
    reader = panes.Recordings()
    for _ in range(50):
        [read] = (await reader.read(host, await tmux.list_panes(host))).values()
        if read.summary.step:
            break
        await asyncio.sleep(0.1)
    assert (read.summary.step, read.summary.progress.done) == (51, 51)
