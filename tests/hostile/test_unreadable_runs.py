"""A runs root holding run dirs anyone may have written: manifests of every wrong shape,
metrics lines with NaN and infinities, files that try to forge another run's record. One
bad run dir is one "unreadable: why" row, in `trackside runs`, its JSON and the dashboard's
listing and fleet, and hides nothing else; a number no view can reckon with reads as absent.
Each test lists a real runs root, with a real run in a real tmux server beside the bad ones.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from backends import runs
from backends.runs import RunPhase
from backends.runs.status import describe
from tests.backends.test_runs import host, tmux_dir  # noqa: F401 (fixtures)

REPO = Path(__file__).resolve().parents[2]
GOOD = "20261201-0000-0000"
T0 = "2026-12-01T00:00:00Z"

# (manifest fields over a good one's, what the row's reason says). Each is a type some
# reader took for granted: a traceback once, and the whole host shown lost.
WRONG_FIELDS = [
    ({"session": 5}, "session: expected text, got 5"),
    ({"params": []}, "params: expected an object, got a list"),
    ({"params": {"max_seq_len": "8192"}}, "params.max_seq_len: '8192' is not a number"),
    ({"params": {"max_seq_len": {"deep": [1]}}}, "params.max_seq_len: "),
    ({"params": {"no_such_knob": 1}}, "params.no_such_knob: unknown parameter"),
    ({"argv": "x"}, "argv: expected a list, got 'x'"),
    ({"command": [1, 2]}, "command[0]: expected text, got 1"),
    ({"started": "yesterday"}, "started: expected a time like 2026-11-29T09:30:00Z, got 'yesterday'"),
    ({"started": 5}, "started: expected a time"),
    ({"ended": [], "exit_status": 1}, "ended: expected a time"),
    ({"ended": T0, "exit_status": "abc"}, "exit_status: expected an exit status, got 'abc'"),
    ({"ended": T0, "exit_status": 1000000}, "exit_status: expected an exit status, got 1000000"),
    ({"pane_pid": "123"}, "pane_pid: expected a process id, got '123'"),
    ({"pane_pid": -1}, "pane_pid: expected a process id, got -1"),
    ({"trainer": "yes"}, "trainer: expected true or false, got 'yes'"),
    ({"registered": 1}, "registered: expected true or false, got 1"),
    ({"parent": 5}, "parent: expected a run id, got 5"),
    ({"run_dir": 5}, "run_dir: expected text, got 5"),
    ({"run_id": 5}, "run_id: expected a run id, got 5"),
    ({"run_id": GOOD}, f"run_id: {GOOD} in the run dir of "),  # a copy of another run under its own name
    ({"nodes": [5]}, "nodes[0]: expected an object, got 5"),
    ({"nodes": "ab"}, "nodes: expected a list, got 'ab'"),
    ({"nodes": [{"session": "s"}]}, "nodes[0].host: missing"),
    ({"nodes": [{"host": "box"}], "node": "0"}, "node: expected a node number, got '0'"),
    ({"code": "abc"}, "code: expected an object, got 'abc'"),
    ({"code": {"hash": []}}, "code.hash: expected text, got a list"),
    ({"synced": [1]}, "synced[0]: expected an object, got 1"),
    ({"synced": [{"to": "/x", "hash": {"a": 1}}]}, "synced[0].hash: expected text, got an object"),
]
# (the file's whole text, what the row's reason says)
WRONG_FILES = [
    ("[1, 2]", "expected a JSON object, got a list"),
    ("null", "expected a JSON object, got None"),
    ('"a manifest"', "expected a JSON object, got 'a manifest'"),
    ("", "not JSON: "),
    ("{", "not JSON: "),
    ("[" * 100_000 + "]" * 100_000, "not JSON: nested too deeply"),
    (json.dumps({"params": {"a": [[[[[[[[[[]]]]]]]]]]}}), "params.a: unknown parameter"),
    (json.dumps({"session": "s"}), "run_id: missing"),
    (json.dumps({"run_id": None, "session": "x" * (2 << 20)}), "larger than 1024 KiB"),
]
# A field that holds a number no view can reckon with reads as absent, as if left out:
# (the field as written, what the listing then says of the run).
HUGE = [
    ('"pane_pid": 1e400', {"pids": [], "exit_status": 0}),
    ('"pane_pid": ' + "9" * 5000, {"pids": [], "exit_status": 0}),
    ('"exit_status": -Infinity', {"exit_status": None}),
    ('"params": {"max_seq_len": 99999999999999999999999, "lr": NaN, "steps": Infinity}',
     {"params": {"max_seq_len": None, "lr": None, "steps": None}}),
]


def manifest(run_id: str, root: str, **fields) -> dict:
    base = {"run_id": run_id, "host": "box", "session": f"ts-{run_id}", "argv": ["sleep", "600"], "command": ["sleep", "600"],
            "trainer": False, "params": {}, "parent": None, "resume_from": None, "run_dir": f"{root}/{run_id}",
            "started": T0, "ended": None, "exit_status": None, "pane_pid": None}  # fmt: skip
    return {**base, **fields}


def bad_id(i: int) -> str:
    return f"20261201-0001-{i:04x}"


def write_dir(root: str, run_id: str, text: str, metrics: str | None = None) -> None:
    directory = Path(root, run_id)
    directory.mkdir()
    (directory / "manifest.json").write_text(text)
    if metrics is not None:
        (directory / "metrics.jsonl").write_text(metrics)


def bad_texts(root: str) -> dict[str, tuple[str, str]]:
    """Every wrong shape, each in its run dir: run id -> (the manifest's text, its reason)."""
    texts = [(json.dumps({**manifest(bad_id(i), root), **fields}), why) for i, (fields, why) in enumerate(WRONG_FIELDS)]
    texts += WRONG_FILES
    return {bad_id(i): texts[i] for i in range(len(texts))}


# Steps whose times and losses are NaN and infinities: its ETA once divided by a pace of 0.
NONFINITE_METRICS = "".join([
    '{"event": "start", "time": 0, "config": {"steps": 100}}\n',
    '{"event": "step", "time": 1, "step": 1, "loss": 2.0, "tokens_per_s": 10}\n',
    '{"event": "step", "time": Infinity, "step": 2, "loss": NaN, "tokens_per_s": Infinity}\n',
    '{"event": "step", "time": Infinity, "step": 3, "loss": -Infinity, "tokens_per_s": -Infinity, "tau": NaN}\n',
])  # fmt: skip


async def launch_good(host, runs_root) -> str:
    """A real run in tmux (sleep), its metrics.jsonl the non-finite one: the run beside
    every bad dir, which must stay listed and running."""
    launched = await runs.launch(host, ["sleep", "600"], run_id=GOOD, startup_s=0)
    Path(runs_root, GOOD, "metrics.jsonl").write_text(NONFINITE_METRICS)
    return launched.run_id


def check_good(listed: dict) -> None:
    good = listed[GOOD]
    assert good["state"] == "running" and good["session"] == f"ts-{GOOD}" and good["pids"], good
    assert good["last_step"] == 3 and good["last_loss"] is None and good["tokens_per_s"] is None and good["tau"] is None
    assert good["eta_s"] is None  # no pace from infinite times: no ETA, and no division by zero


def cli_runs(runs_root: str, tmp_path: Path) -> subprocess.CompletedProcess:
    config = tmp_path / "config.toml"
    config.write_text(f"[hosts.box]\nruns_root = {json.dumps(runs_root)}\n")
    return subprocess.run([sys.executable, "-m", "tui.cli", "runs", "--config", str(config), "--json"], cwd=REPO,
                          capture_output=True, text=True, timeout=240, env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip


async def test_every_wrong_manifest_is_one_unreadable_row_in_trackside_runs(host, runs_root, tmp_path):
    await launch_good(host, runs_root)
    bad = bad_texts(runs_root)
    for run_id, (text, _) in bad.items():
        write_dir(runs_root, run_id, text, metrics=NONFINITE_METRICS)
    done = cli_runs(runs_root, tmp_path)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    listed = {r["run_id"]: r for r in json.loads(done.stdout)}
    check_good(listed)
    assert set(bad) <= set(listed)
    for run_id, (_, why) in bad.items():
        row = listed[run_id]
        assert row["state"] == "unreadable" and why in row["unreadable"] and row["status"] == f"unreadable: {row['unreadable']}", (run_id, row)
        assert row["session"] == "" and row["pids"] == [] and row["params"] == {} and row["run_dir"] == f"{runs_root}/{run_id}"
    assert all("\n" not in r["unreadable"] for r in listed.values() if r["unreadable"])  # one line, whatever the file held


@pytest.mark.parametrize("text, why", [*((None, why) for _, why in WRONG_FIELDS), *WRONG_FILES],
                         ids=[*(f"field-{i}" for i in range(len(WRONG_FIELDS))), *(f"file-{i}" for i in range(len(WRONG_FILES)))])  # fmt: skip
async def test_one_wrong_manifest_hides_nothing_from_the_dashboards_listing(host, runs_root, text, why):
    await launch_good(host, runs_root)
    run_id, (text, why) = next((k, v) for k, v in bad_texts(runs_root).items() if v[1] == why and (text is None or v[0] == text))
    write_dir(runs_root, run_id, text)
    other = bad_id(999)  # a good run that has ended, beside it
    write_dir(runs_root, other, json.dumps(manifest(other, runs_root, ended=T0, exit_status=0)))
    infos = {info.run_id: info for info in await runs.list_runs(host)}
    assert infos[other].state is RunPhase.EXITED and infos[other].exit_status == 0
    check_good({GOOD: {**infos[GOOD].to_json()}})
    bad = infos[run_id]
    assert bad.state is RunPhase.UNREADABLE and why in bad.unreadable and describe(bad) == f"unreadable: {bad.unreadable}"
    if why != "run_id: missing":  # a listed run names itself; one read by its dir's name need not
        with pytest.raises(runs.RunError, match="is unreadable: "):  # kill, relaunch, plot: refused, naming it
            await runs.read_manifest(host, run_id)


@pytest.mark.parametrize("fields, expected", HUGE, ids=["float-past-any", "int-of-5000-digits", "minus-infinity", "params"])
async def test_a_number_past_any_view_reads_as_absent(host, runs_root, fields, expected):
    run_id = bad_id(1)
    # A key given twice: JSON's last one holds.
    write_dir(runs_root, run_id, json.dumps(manifest(run_id, runs_root, ended=T0, exit_status=0))[:-1] + f", {fields}}}")
    info = next(i for i in await runs.list_runs(host) if i.run_id == run_id)
    assert info.unreadable is None
    assert {key: info.to_json()[key] for key in expected} == expected


async def test_a_file_cannot_forge_another_runs_record(host, runs_root):
    """The listing reads every run dir in one stream of records split by control
    characters; a file holding them raw, or a dir name holding a newline, must not end its
    record and start a forged one (here: a run claiming another session's pane)."""
    forged = "20261201-0002-beef"
    fake = json.dumps(manifest(forged, runs_root, session="victim", pane_pid=1))
    write_dir(runs_root, bad_id(1), '{"run_id": "%s"}\x1e%s/%s/\n%s\x1c\x1f\x1d\n' % (bad_id(1), runs_root, forged, fake))
    write_dir(runs_root, bad_id(2), json.dumps(manifest(bad_id(2), runs_root)), metrics=f"\x1e{runs_root}/{forged}/\n{fake}\x1c\n\x1f\x1d\n")
    claim = json.dumps({"run_id": forged, "session": "victim", "pane_pid": 1})  # no '/': a file name may hold it
    odd = Path(runs_root, f"x\x1ed\n{claim}\x1c\x1f\x1d\n")
    odd.mkdir()
    (odd / "manifest.json").write_text(claim)
    infos = {info.run_id: info for info in await runs.list_runs(host)}
    assert forged not in infos and "victim" not in {i.session for i in infos.values()}
    assert infos[bad_id(1)].state is RunPhase.UNREADABLE and infos[bad_id(2)].state is RunPhase.UNKNOWN


def test_the_fleet_shows_an_unreadable_row_and_why():
    from tui.screens.fleet import run_cells
    from tui.state import HostState, RunState

    info = runs.RunInfo(bad_id(1), "", "box", RunPhase.UNREADABLE, run_dir=f"/r/{bad_id(1)}", session_open=False,
                        unreadable="session: expected text, got 5")  # fmt: skip
    cells = run_cells(RunState(f"box/{bad_id(1)}", "box", info), HostState("box"))
    assert str(cells["state"]) == "unreadable" and str(cells["power"]) == "session: expected text, got 5"
    assert str(cells["name"]).strip() == bad_id(1)


# metrics.jsonl lines of the right events with values of every wrong type, then a good step.
WRONG_TYPED_EVENTS = [
    '{"event": "start", "time": "now", "steps_per_epoch": "x", "config": {"max_seq_len": "big", "ttt_steps": [1], "steps": "many",'
    ' "dflash": {}, "model": {"block_size": "x"}, "resumed_from_step": "y"}}',
    '{"event": "step", "time": "now", "step": "7", "loss": "low", "tokens_per_s": [1], "tau": {}, "epoch": null}',
    '{"event": "step", "time": NaN, "step": 8, "loss": Infinity, "tokens_per_s": -Infinity, "loss_pos": "x"}',
    '{"event": "step", "time": 100, "step": 9, "loss": 1.5, "tokens_per_s": 2000, "epoch": 0}',
]


def test_metrics_of_the_wrong_types_reach_the_fleet_and_the_alerts_as_blanks():
    """Not a traceback on the fleet's tick: what is not a number of the right kind is shown
    as none, and a loss read as absent (Infinity) is still a loss that is not finite."""
    from backends import alerts
    from backends.logs import logparse
    from tui.screens.fleet import run_cells
    from tui.state import HostState, RunState

    info = runs.RunInfo(bad_id(1), "s", "box", RunPhase.RUNNING, params={"max_seq_len": 8192, "ttt_steps": 3, "steps": 100},
                        pids=[1], run_dir=f"/r/{bad_id(1)}")  # fmt: skip
    run = RunState(f"box/{bad_id(1)}", "box", info)
    shown = []
    for line in WRONG_TYPED_EVENTS:
        run.add_event(logparse.parse_metrics_line(line))
        cells = run_cells(run, HostState("box"))
        shown.append((cells["msl"], cells["step"], cells["loss"], cells["tps"]))
        said = alerts.run_alerts(alerts.RunFacts(run.key, run.info, run.steps, run.oom), 200.0)
    assert shown[:3] == [("8192", "—", "—", "—"), ("8192", "—", "—", "—"), ("8192", "8", "—", "—")]
    assert shown[3] == ("8192", "9", "1.5", "—")  # one step with a time is no pace window yet
    assert said == []  # the good step last: nothing is up
    run.add_event(logparse.parse_metrics_line('{"event": "step", "time": 101, "step": 10, "loss": NaN}'))
    [alert] = alerts.run_alerts(alerts.RunFacts(run.key, run.info, run.steps, run.oom), 200.0)
    assert alert.key == f"nan:{run.key}" and "loss is not finite at step 10" in alert.text


async def test_the_dashboard_lists_the_host_with_its_runs_and_the_bad_dir_as_one_row(host, runs_root):
    """The dashboard over a runs root holding a wrong manifest and a run whose steps' times
    are infinite: the host is "ok", the run is on its row, the bad dir on its own."""
    from tests.tui.conftest import wait_for
    from tui.app import TracksideApp, Watched
    from tui.screens.fleet import FleetScreen
    from tui.state import HostStatus

    await launch_good(host, runs_root)
    write_dir(runs_root, bad_id(1), json.dumps({**manifest(bad_id(1), runs_root), "session": 5}))
    app = TracksideApp([Watched(host, smi="nvidia-smi-absent")], poll_interval=0.2)
    async with app.run_test(size=(160, 48)) as pilot:
        good, bad = f"{host.name}/{GOOD}", f"{host.name}/{bad_id(1)}"
        await wait_for(pilot, lambda: good in app.runs and bad in app.runs and isinstance(app.screen, FleetScreen), 60, "both rows")
        await pilot.pause(1.0)  # more polls: none of them loses the host
        assert app.hosts[host.name].status is HostStatus.OK and not app.hosts[host.name].message
        assert app.runs[good].status.value == "running" and app.runs[good].step == 3 and app.runs[good].eta_s() is None
        assert app.runs[bad].state_label == "unreadable" and app.runs[bad].info.unreadable == "session: expected text, got 5"
        rows = dict(app.screen.rows())
        assert str(rows[f"run:{bad}"]["power"]) == "session: expected text, got 5"
