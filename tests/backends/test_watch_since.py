"""`trackside watch --since`: the alerts that would have fired while nobody watched, from
what was recorded — an under-fed stretch in the host's GPU recording (the recorder's day
files, as it writes them) and a run that exited 3 — each at its moment."""

from __future__ import annotations

import json
import time

from backends.recorder import layout
from tests.backends.test_runs import tmux_dir  # noqa: F401 - the fixture: this test's own tmux server
from tests.waiting import until
from tui.cli import main


def stamp(line: str) -> float:
    return time.mktime(time.strptime(line[:19], "%Y-%m-%d %H:%M:%S"))


def test_an_underfed_stretch_and_an_exit_are_found_each_at_its_moment(tmp_path, capsys, tmux_dir):  # noqa: F811
    root = tmp_path / "runs"
    config = tmp_path / "config.toml"
    config.write_text(f"[hosts.box]\nruns_root = {json.dumps(str(root))}\nrecord = false\n[alerts]\nunderfed_s = 60\n")
    # Ten minutes ago GPU 0 drew 100 W of 700 W at 99 % for five minutes, then 690 W.
    now = time.time()
    starved, fed = now - 900, now - 600
    gpu = [f"{starved:.2f},0,GPU-00000000-1111-2222-3333-444444444444"]
    gpu += [f"{starved + s:.2f},0,{100 if starved + s < fed else 690},700.00,1000,143771,99" for s in range(0, 400)]
    (root / "gpu").mkdir(parents=True, mode=0o700)
    (root / "gpu" / f"{layout.day_of(now)}.gpu").write_text("".join(f"{line}\n" for line in gpu))
    if layout.day_of(starved) != layout.day_of(now):  # just past midnight: the stretch is yesterday's
        (root / "gpu" / f"{layout.day_of(starved)}.gpu").write_text("".join(f"{line}\n" for line in gpu))

    assert main(["launch", "--config", str(config), "--json", "--", "sh", "-c", "sleep 3; exit 3"]) == 0
    run_id = json.loads(capsys.readouterr().out)["run_id"]
    exited = root / run_id / "exit_status"
    until(exited.exists, 60, "the run's exit")
    ended = exited.stat().st_mtime

    code = main(["watch", "--since", "20m", "--config", str(config)])
    lines = capsys.readouterr().out.splitlines()
    assert code == 1, lines
    underfed = [line for line in lines if "under-fed GPU 0 on box: 100 W of 700 W at >90% util for 1m" in line and "warning" in line]
    cleared = [line for line in lines if "cleared" in line and "under-fed" in line]
    failed = [line for line in lines if f"box/{run_id} failed: exit status 3" in line]
    assert len(underfed) == len(cleared) == len(failed) == 1, lines
    assert abs(stamp(underfed[0]) - (starved + 60)) <= 6
    assert abs(stamp(cleared[0]) - fed) <= 6
    assert abs(stamp(failed[0]) - ended) <= 6  # when it exited, not when a listing saw it


def test_a_quiet_stretch_says_so_and_a_host_without_a_recording_is_not_called_quiet(tmp_path, capsys):
    """Nothing recorded that would have alerted: stdout stays empty (only alerts go there),
    and stderr says the recordings were read and held none, not a silent exit; a host whose
    GPUs were not recorded is named, its GPUs unchecked."""
    root = tmp_path / "runs"
    config = tmp_path / "config.toml"
    config.write_text(f"[hosts.box]\nruns_root = {json.dumps(str(root))}\nrecord = false\n"
                      f"[hosts.bare]\nruns_root = {json.dumps(str(tmp_path / 'bare'))}\nrecord = false\n")
    now = time.time()
    gpu = [f"{now - 300:.2f},0,GPU-00000000-1111-2222-3333-444444444444"]
    gpu += [f"{now - 300 + s:.2f},0,690,700.00,1000,143771,99" for s in range(0, 200)]
    (root / "gpu").mkdir(parents=True, mode=0o700)
    (root / "gpu" / f"{layout.day_of(now)}.gpu").write_text("".join(f"{line}\n" for line in gpu))
    assert main(["watch", "--since", "20m", "--config", str(config)]) == 0
    out, err = capsys.readouterr()
    assert out == ""
    unrecorded, quiet = err.splitlines()
    assert unrecorded == "trackside watch: bare: no GPU recording over the span: its under-fed GPUs not checked"
    assert quiet.startswith("trackside watch: no alert would have fired since ") and quiet.endswith(" on box, bare")
    assert abs(stamp(quiet.split("since ")[1]) - (now - 1200)) <= 5


def test_steps_skipped_while_nobody_watched_are_an_alert_raised_and_cleared(tmp_path, capsys, tmux_dir):  # noqa: F811
    """A trainer's nonfinite event (a step not applied) raises "skipping" until a step is
    applied again, the alert the dashboard raises (backends/alerts.py)."""
    root = tmp_path / "runs"
    config = tmp_path / "config.toml"
    config.write_text(f"[hosts.box]\nruns_root = {json.dumps(str(root))}\nrecord = false\n")
    assert main(["launch", "--config", str(config), "--json", "--", "sh", "-c", "sleep 2"]) == 0
    run_id = json.loads(capsys.readouterr().out)["run_id"]
    metrics = root / run_id / "metrics.jsonl"
    events = [*({"event": "step", "step": n, "loss": 2.0} for n in range(1, 6)),
              {"event": "nonfinite", "step": 6, "what": "grad_norm", "in_a_row": 1}, {"event": "step", "step": 6, "loss": 2.0}]
    for event in events:  # as a trainer writes them: each stamped when it is written
        time.sleep(0.2)
        event["time"] = time.time()
        with metrics.open("a") as f:
            f.write(json.dumps(event) + "\n")
    until((root / run_id / "exit_status").exists, 60, "the run's exit")

    code = main(["watch", "--since", "20m", "--config", str(config)])
    lines = capsys.readouterr().out.splitlines()
    assert code == 1, lines
    skipping = [line for line in lines if f"error    box/{run_id} skipping 1 steps in a row at step 6: its grad_norm" in line]
    cleared = [line for line in lines if "cleared" in line and "skipping" in line]
    assert len(skipping) == len(cleared) == 1 and len(lines) == 2, lines
    assert abs(stamp(skipping[0]) - events[5]["time"]) <= 1 and abs(stamp(cleared[0]) - events[6]["time"]) <= 1
