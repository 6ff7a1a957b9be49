"""A run's status and step as the fleet, the run screen and the alerts all read them."""

from __future__ import annotations

import dataclasses

import pytest

from backends.runs import RunPhase as Listed
from backends.runs.status import describe
from scripts.sample import NOW, gpus, metrics_events, run_info
from tui.screens.fleet import host_cells, run_cells
from tui.screens.run import stats_text
from tui.state import STYLES, HostState, HostStatus, RunState, RunStatus


def ended(listed: Listed = Listed.EXITED, code: int | None = None, end: str | None = None) -> RunState:
    info = dataclasses.replace(run_info(listed), exit_status=code, end_status=end)
    return RunState("h200-box/r", "h200-box", info)


@pytest.mark.parametrize("run, status, label", [
    (ended(code=127), RunStatus.FAILED, "failed (127)"),  # `sh: trackside: not found`
    (ended(code=1, end="failed"), RunStatus.FAILED, "failed (1)"),
    (ended(code=-9), RunStatus.KILLED, "killed (SIGKILL)"),
    (ended(code=0), RunStatus.FINISHED, "finished"),
    (ended(code=0, end="completed"), RunStatus.FINISHED, "finished"),
    (ended(code=1, end="stopped"), RunStatus.STOPPED, "stopped"),  # torchrun's own exit 1
    (ended(), RunStatus.UNKNOWN, "unknown"),
    (ended(Listed.OOM, code=3), RunStatus.OOM, "OOM"),
    (ended(code=4, end="nonfinite"), RunStatus.NONFINITE, "nonfinite"),  # not "failed (4)"
    (ended(Listed.RUNNING), RunStatus.RUNNING, "running"),
])
def test_how_a_run_ended_reads_the_same_on_every_screen(run, status, label):
    assert (run.status, run.state_label) == (status, label)
    cell = run_cells(run, HostState("h200-box"))["state"]
    assert (cell.plain, str(cell.style)) == (label, STYLES[status])
    state_line = stats_text(run, NOW).plain.splitlines()[1]
    assert state_line.startswith(f"state {status.label}")
    assert describe(run.info) == label  # `trackside runs` says what the screens say


def test_failures_stand_out_and_a_clean_end_does_not():
    failures = {RunStatus.FAILED, RunStatus.KILLED, RunStatus.OOM, RunStatus.NONFINITE}
    assert {s for s in RunStatus if "red" in STYLES[s]} == failures == {s for s in RunStatus if s.failed}


def test_an_oom_event_and_the_oom_exit_code_read_alike():
    by_event = ended(Listed.RUNNING)
    by_event.add_event({"event": "oom", "max_seq_len": 32768, "ttt_steps": 5})
    by_code = ended(Listed.OOM, code=3)
    for run in (by_event, by_code):
        cell = run_cells(run, HostState("h200-box"))["state"]
        assert (run.status, cell.plain, str(cell.style)) == (RunStatus.OOM, "OOM", "bold red")


def test_a_loading_run_shows_its_phase():
    from backends.logs.logparse import Progress

    run = ended(Listed.RUNNING)
    run.info.progress = Progress("loading", 3, 10, None)
    assert run.status is RunStatus.RUNNING and run.state_label == "loading"
    assert run_cells(run, HostState("h200-box"))["state"].plain == "loading 3/10"


@pytest.mark.parametrize("step, per_epoch, shown", [
    (152, 104, "152 (epoch 1, 48/104)"),
    (104, 104, "104 (epoch 0, 104/104)"),
    (105, 104, "105 (epoch 1, 1/104)"),
    (20000, 4120, "20,000 (epoch 4, 3520/4120)"),
    (152, None, "152"),
    (None, 104, "—"),
])
def test_the_step_says_where_it_falls_in_its_epoch(step, per_epoch, shown):
    run = RunState("h/r", "h", dataclasses.replace(run_info(), last_step=step, steps_per_epoch=per_epoch))
    assert run.step_text == shown
    assert run_cells(run, HostState("h"))["step"] == shown
    assert f"step {shown}\n" in stats_text(run, NOW).plain


def test_the_step_of_a_metrics_stream_counts_from_its_start_event():
    run = RunState("h/r", "h", run_info())
    for event in metrics_events(5):
        run.add_event(event)
    assert run.step_text == "5 (epoch 0, 5/4120)"


def test_a_host_status_given_as_its_word_reads_as_the_enum():
    host = HostState("pve-129", status="auth", message="refused our keys", gpus=gpus())
    assert host.status is HostStatus.AUTH and host.status.lost
    cells = host_cells(host, NOW, 1.0)
    assert cells["state"].plain == "auth" and str(cells["state"].style) == "bold red"
    assert cells["power"].plain == "refused our keys"  # why, in the row's widest cell
    assert not HostState("h").status.lost


def test_a_run_that_ended_shows_no_pace():
    """tokens/s and an ETA are a running run's: an ended one shows neither."""
    run = ended(code=0, end="completed")
    for event in metrics_events(5):
        run.add_event(event)
    cells = run_cells(run, HostState("h200-box"))
    assert (run.tokens_per_s, run.eta_s(), cells["tps"], cells["eta"]) == (None, None, "—", "—")


def test_a_new_trainer_run_reads_starting_then_its_first_step_then_when_that_came():
    """The operator's loop, as the screens say it: `starting` until the trainer's start
    event, `first step…` (loading done; compiling, on a GPU) until its first step, then
    how long after its process started the first step came, on the trainer's clock."""
    run = RunState("h/r", "h", dataclasses.replace(run_info(), last_step=None, last_loss=None))  # listed before its first step
    assert run.state_label == "starting"
    [start, first, *_] = metrics_events(3)
    run.add_event({**start, "time": 1000.0 + 4.2, "process_started": 1000.0})
    assert run.state_label == "first step…"
    run.add_event({**first, "time": 1000.0 + 12.5})
    assert run.state_label == "running"
    assert "first step 12.5 s after its process started (start event at 4.2 s)" in stats_text(run, NOW).plain
    assert RunState("h/s", "h", dataclasses.replace(run_info(), params={})).state_label == "running"  # not our trainer


def test_on_a_gpu_the_wait_for_the_first_step_reads_compiling_and_the_start_up_is_itemised():
    """A GPU trainer's first step after its start event is its compiler's work (a new
    process traces its compiled parts again): `compiling`; the stats then say where the
    start-up's seconds went, from the start event's `startup_s`."""
    run = RunState("h/r", "h", dataclasses.replace(run_info(), last_step=None, last_loss=None))
    [start, first, *_] = metrics_events(3)
    startup = {"imports_device": 3.75, "data": 0.02, "model": 0.39, "resume": 0.0}
    run.add_event({**start, "config": {**start["config"], "device": "cuda"}, "time": 1000.0 + 5.7,
                   "process_started": 1000.0, "startup_s": startup})  # fmt: skip
    assert run.state_label == "compiling"
    run.add_event({**first, "time": 1000.0 + 14.6})
    assert ("first step 14.6 s after its process started (start event at 5.7 s: "
            "imports and CUDA 3.8, data 0.0, model 0.4)") in stats_text(run, NOW).plain
