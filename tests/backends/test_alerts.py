"""Alert rules on plain data, the book that raises each cause once, the alert command, and
the `[alerts]` config."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shlex
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from backends import alerts
from backends.alerts import AlertBook, HostFacts, RunFacts, Rules, format_duration
from backends.config import ConfigError, load_config
from backends.gpu import GpuProcess, GpuReading
from backends.kill import GpuDelta, KillReport
from backends.runs import RunInfo, RunPhase
from training.handover import alive

NOW = 1_790_000_000.0
STARTED = "2026-09-21T14:13:20Z"  # NOW, as a manifest writes it


def readings(power_w: float, util: int = 100) -> list[GpuReading]:
    return [GpuReading(i, "NVIDIA H200", f"GPU-{i}", power_w + 7 * i, 600.0, 40960, 143771, util, 61) for i in range(8)]


def info(state: RunPhase = RunPhase.RUNNING, code: int | None = None, **changes) -> RunInfo:
    return dataclasses.replace(
        RunInfo("20260921-1413-a1b2", "dflash", "box", state, code, started=STARTED), **changes
    )


def steps(losses: list[float], every_s: float = 2.0, start: float = NOW) -> list[dict]:
    return [{"event": "step", "time": start + n * every_s, "step": n + 1, "loss": loss} for n, loss in enumerate(losses)]


def causes(found) -> list[str]:
    return [alert.cause for alert in found]


def test_underfed_gpus_are_flagged_after_the_set_time_and_cleared_when_fed():
    since: dict[int, float | None] = {}

    def host(power_w: float, now: float, util: int = 100) -> HostFacts:
        pairs = [(r, alerts.underfed_since(r, since.get(r.index), now)) for r in readings(power_w, util)]
        since.update((r.index, s) for r, s in pairs)
        return HostFacts("h200-box", gpus=pairs)

    host(250.0, NOW)
    assert alerts.host_alerts(host(250.0, NOW + 59), NOW + 59) == []
    [alert] = alerts.host_alerts(host(250.0, NOW + 60), NOW + 60)
    assert alert.key == "underfed:h200-box"
    assert "GPUs 0,1,2,3,4,5,6,7 on h200-box: 250–299 W of 600 W at >90% util for 1m00s" in alert.text
    assert alerts.host_alerts(host(550.0, NOW + 61), NOW + 200) == []  # fed again: the clock restarts
    assert alerts.host_alerts(host(250.0, NOW + 300, util=40), NOW + 400) == []  # idle, not under-fed
    assert alerts.host_alerts(host(250.0, NOW + 500), NOW + 530, Rules(underfed_s=30)) != []


def test_a_lost_host_is_an_error_alert_naming_why():
    [alert] = alerts.host_alerts(HostFacts("pve-129", lost="root@10.0.0.129 refused our keys"), NOW)
    assert alert.severity == "error" and alert.text == "pve-129 lost: root@10.0.0.129 refused our keys"


@pytest.mark.parametrize("state, code, end, expected", [
    (RunPhase.EXITED, 1, None, "box/r failed: exit status 1"),
    (RunPhase.EXITED, -9, None, "box/r was killed by SIGKILL"),
    (RunPhase.EXITED, 0, None, None),
    (RunPhase.EXITED, 1, "stopped", None),  # torchrun's 1 after the trainer's own clean stop
    (RunPhase.OOM, 3, None, "box/r ran out of GPU memory (exit status 3)"),
    (RunPhase.EXITED, 4, "nonfinite", "box/r stopped: step after step had a NaN/inf loss or gradient (none applied; its weights are its last finite step's)"),
    (RunPhase.RUNNING, None, None, None),
])  # fmt: skip
def test_how_a_run_ended(state, code, end, expected):
    found = alerts.run_alerts(RunFacts("box/r", info(state, code, end_status=end)), NOW)
    assert [a.text for a in found] == ([expected] if expected else [])


def test_oom_names_the_params_it_tried():
    oom = {"event": "oom", "max_seq_len": 32768, "ttt_steps": 5, "tried_gib": 12.0, "peak_mem_gib": 95.1}
    [alert] = alerts.run_alerts(RunFacts("box/r", info(RunPhase.OOM, 3), oom=oom), NOW)
    assert alert.key == "oom:box/r" and "max_seq_len=32768, ttt_steps=5, tried_gib=12.0, peak_mem_gib=95.1" in alert.text


@pytest.mark.parametrize("loss", [float("nan"), float("inf")])
def test_a_loss_that_is_not_a_number(loss):
    [alert] = alerts.run_alerts(RunFacts("box/r", info(), steps([2.0, 1.9, loss])), NOW + 4)
    assert alert.key == "nan:box/r" and "loss is not finite at step 3" in alert.text


def test_a_loss_that_jumps_past_three_times_its_recent_median():
    calm = [2.0, 1.9, 2.1, 1.8, 2.0, 1.7]
    assert alerts.run_alerts(RunFacts("box/r", info(), steps(calm + [5.8])), NOW) == []
    [alert] = alerts.run_alerts(RunFacts("box/r", info(), steps(calm + [6.0])), NOW)
    assert alert.cause == "jump" and "6 at step 7 (3.1× its recent median 1.95)" in alert.text
    # a run's first steps are no baseline: a loss that falls from 10 to 2 is no jump either
    assert alerts.run_alerts(RunFacts("box/r", info(), steps([0.5, 3.0])), NOW) == []


def test_a_stall_is_counted_in_the_runs_own_step_times_never_under_the_floor():
    fast = steps([2.0] * 10, every_s=2.0)  # last step at NOW + 18
    run = RunFacts("box/r", info(), fast)
    rules = Rules(stall_floor_s=5.0)
    assert alerts.run_alerts(run, NOW + 18 + 20, rules) == []  # 10 × 2 s
    [stall] = alerts.run_alerts(run, NOW + 18 + 21, rules)
    assert stall.text == "box/r stalled: no step for 21s"
    assert alerts.run_alerts(run, NOW + 18 + 21) == []  # the default floor: 5 minutes
    ended = RunFacts("box/r", info(RunPhase.EXITED, 0), fast)
    assert alerts.run_alerts(ended, NOW + 10_000, rules) == []  # an ended run does not stall


def test_kill_alert_names_each_straggler():
    def report(stragglers):
        return KillReport(
            target="r", session="dflash", run_id="r", signalled=[1, 2], killed=[], survivors=[],
            gpus=[GpuDelta(0, 75000, 0)], gpu_processes_before=[], stragglers=stragglers, other_holders=[],
            released=not stragglers, gpu_status="OK", gpu_message="", exit_status=0, seconds=1.5, release_s=0.2,
        )  # fmt: skip

    assert alerts.kill_alert("h/r", report([])) is None
    alert = alerts.kill_alert("h/r", report([GpuProcess(77, 3, 76800, "python3")]))
    assert "PID 77 (python3) holds 76800 MiB on GPU 3" in alert.text


def test_the_book_raises_a_cause_once_clears_it_and_raises_it_again_when_it_returns():
    book = AlertBook(since=NOW)
    lost = HostFacts("gpu1", lost="connection refused")
    assert causes(book.evaluate([lost], [], NOW)) == ["lost"]
    assert book.evaluate([lost], [], NOW + 1) == []  # still lost: not announced again
    assert book.evaluate([HostFacts("gpu1")], [], NOW + 2) == []
    assert [(e.raised, e.cleared) for e in book.entries] == [(NOW, NOW + 2)]
    assert causes(book.evaluate([lost], [], NOW + 3)) == ["lost"]
    assert [e.cleared for e in book.entries] == [NOW + 2, None] and causes(book.current) == ["lost"]


def test_runs_that_ended_before_the_watcher_are_history_not_alerts():
    book = AlertBook(since=NOW)
    old = RunFacts("box/old", info(RunPhase.EXITED, 1, started="2026-09-20T10:00:00Z"))
    assert book.evaluate([], [old], NOW) == []
    seen = RunFacts("box/seen", info(started="2026-09-20T10:00:00Z"))
    book.evaluate([], [old, seen], NOW + 1)
    seen.info = dataclasses.replace(seen.info, state=RunPhase.EXITED, exit_status=1)
    new = RunFacts("box/new", info(RunPhase.EXITED, 2, run_id="20260921-1414-c3d4"))  # started as the watcher did
    assert sorted(a.key for a in book.evaluate([], [old, seen, new], NOW + 2)) == ["failed:box/new", "failed:box/seen"]


def test_a_relaunch_answers_its_parents_end():
    book = AlertBook(since=NOW)
    failed = RunFacts("box/r", info(RunPhase.EXITED, 1))
    assert causes(book.evaluate([], [failed], NOW)) == ["failed"]
    child = RunFacts("box/child", info(run_id="20260921-1420-ffff", parent=failed.info.run_id))
    assert book.evaluate([], [failed, child], NOW + 1) == [] and book.current == []


def test_a_run_the_operator_stopped_ends_without_an_alert():
    book = AlertBook(since=NOW)
    running = RunFacts("box/r", info())
    book.evaluate([], [running], NOW)
    book.stopped("box/r")
    killed = RunFacts("box/r", info(RunPhase.EXITED, -15))
    assert book.evaluate([], [killed], NOW + 1) == []
    other = RunFacts("box/other", info(RunPhase.EXITED, -15, run_id="20260921-1415-0000"))
    assert causes(book.evaluate([], [killed, other], NOW + 2)) == ["failed"]


def command(tmp_path: Path, script: str) -> list[str]:
    return [sys.executable, "-c", script, str(tmp_path / "got")]


async def test_the_command_reads_the_alert_as_json_on_stdin(tmp_path):
    alert = alerts.Alert("failed:box/r", "box/r failed: exit status 1", "error")
    argv = command(tmp_path, "import sys; open(sys.argv[1], 'w').write(sys.stdin.read())")
    assert await alerts.run_command(argv, alert, NOW) is None
    sent = json.loads((tmp_path / "got").read_text())
    assert sent == {
        "cause": "failed", "subject": "box/r", "key": "failed:box/r", "severity": "error",
        "text": "box/r failed: exit status 1", "time": NOW, "time_utc": STARTED,
    }  # fmt: skip


async def test_a_command_that_fails_or_hangs_is_one_line(tmp_path):
    alert = alerts.Alert("lost:h", "h lost: gone")
    failing = command(tmp_path, "import sys; sys.stdin.read(); print('webhook said 403', file=sys.stderr); sys.exit(22)")
    assert await alerts.run_command(failing, alert, NOW) == f"alert command {shlex.join(failing)} exited 22: webhook said 403"
    missing = await alerts.run_command(["/nonexistent/notify"], alert, NOW)
    assert missing == "alert command /nonexistent/notify could not start: No such file or directory"
    # a command that hangs, with a child of its own holding its stderr open: both killed
    started = time.monotonic()
    hung = await alerts.run_command(["sh", "-c", "sleep 30 & sleep 30"], alert, NOW, timeout_s=0.5)
    assert time.monotonic() - started < 5
    assert hung == "alert command sh -c 'sleep 30 & sleep 30' did not finish within 0.5s: killed"


async def test_a_hung_command_whose_child_left_its_group_holding_stderr_is_one_line_at_its_timeout():
    # A daemon the command started (setsid) outlives the group's kill, and holds its stderr.
    holder = f"sleep 120.{uuid.uuid4().int % 10**9:09d}"
    argv = ["sh", "-c", f"setsid {holder} & sleep 60"]
    try:
        async with asyncio.timeout(60):
            hung = await alerts.run_command(argv, alerts.Alert("lost:h", "h lost"), NOW, timeout_s=0.5)
        assert hung == f"alert command {shlex.join(argv)} did not finish within 0.5s: killed"
    finally:
        subprocess.run(["pkill", "-f", holder])


async def test_a_command_whose_watcher_stops_is_killed_with_its_children(tmp_path):
    pid_file = tmp_path / "child"
    argv = ["sh", "-c", 'sleep 30 & echo $! > "$1"; wait', "sh", str(pid_file)]
    task = asyncio.create_task(alerts.run_command(argv, alerts.Alert("lost:h", "h lost"), NOW))
    while not pid_file.exists() or not pid_file.read_text().strip():
        await asyncio.sleep(0.05)
    started = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert time.monotonic() - started < 5  # not left to sleep its 30 s out
    child = int(pid_file.read_text())
    for _ in range(50):
        if not alive(child):
            break
        await asyncio.sleep(0.05)
    assert not alive(child)


def write(tmp_path, text: str) -> str:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return str(path)


def test_the_alerts_table_of_the_config(tmp_path):
    config = load_config(write(tmp_path, '[alerts]\ncommand = "sh -c \'cat >> /tmp/x\'"\nstall_floor_s = 30\n'))
    assert config.alerts["command"] == ["sh", "-c", "cat >> /tmp/x"]
    assert config.alerts["timeout_s"] == alerts.COMMAND_TIMEOUT_S
    assert config.alert_rules == Rules(stall_floor_s=30.0)
    assert load_config(write(tmp_path, "")).alerts["command"] is None


@pytest.mark.parametrize("text, key", [
    ('[alerts]\ncommand = []', "alerts.command: expected a command, got an empty one"),
    ('[alerts]\ncommand = 3', "alerts.command: expected a list of strings or a string, got 3"),
    ('[alerts]\ntimeout_s = 0', "alerts.timeout_s: expected a number from 0.1 to 3600 seconds, got 0"),
    ('[alerts]\nstall_floor_s = "5m"', 'alerts.stall_floor_s: expected a number from 1 to 604800 seconds, got "5m"'),
    ('[alerts]\nwebhook = "x"', "alerts.webhook: unknown setting (known: command, stall_floor_s, timeout_s, underfed_s)"),
    ('alerts = 1', "alerts: expected a table, got 1"),
])  # fmt: skip
def test_a_bad_alerts_table_names_the_key(tmp_path, text, key):
    with pytest.raises(ConfigError) as raised:
        load_config(write(tmp_path, text))
    assert str(raised.value).endswith(key)


def test_the_readmes_example_shows_every_alerts_setting():
    from backends import config as module

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    example = readme.split("```toml\n", 1)[1].split("```", 1)[0]
    alerts_table = example.split("\n[alerts]", 1)[1]
    for key in module.ALERTS_SCHEMA:
        assert f"\n{key} = " in alerts_table, key


@pytest.mark.parametrize("seconds, shown", [
    (None, "—"), (0, "0s"), (0.3, "<1s"), (0.95, "1s"), (1.9, "2s"), (59.4, "59s"),
    (59.6, "1m00s"), (90, "1m30s"), (3600 * 7 + 32 * 60 + 10, "7h32m")])
def test_durations_read_to_the_nearest_second(seconds, shown):
    # the edit form showed an epoch of 0.95 s as "0s" beside the edit's "≈1s"
    assert format_duration(seconds) == shown
