"""The alert rules replayed over a past (backends/history/alert_times.py): the times a
watcher polling all along would have raised and cleared each alert, for the cases where a
replay drifts from it — the recorder down or hiccuping, 1-minute means turning to samples,
a process hung after its OOM, an exit time known to the second, a run relaunched."""

from __future__ import annotations

from backends.alerts import Rules
from backends.history.alert_times import RunPast, host_alert_times, run_alert_times
from backends.recorder.read import Gap, GpuSample, Recording
from backends.runs import RunInfo, RunPhase

T0 = 1_800_000_000.0
RULES = Rules(underfed_s=60)


def recording(times, gaps=(), coarse_before=None, power=100.0) -> Recording:
    gpus = tuple(GpuSample(T0 + t, 0, "GPU-a", power, 700.0, 1000.0, 80000.0, 99.0) for t in times)
    return Recording(gpus=gpus, procs=(), panes=(), logs=(), gaps=tuple(gaps), coarse_before=coarse_before)


def said(found) -> list[tuple[float, str, str]]:
    return [(round(at - T0, 1), word, alert.cause) for at, word, alert in found]


def test_an_underfed_gpu_is_cleared_where_the_recorder_went_down_not_where_it_came_back():
    rec = recording([*range(0, 300), *range(3000, 3010)], gaps=[Gap(T0 + 299, T0 + 3000)])
    assert said(host_alert_times("box", rec, T0, T0 + 3010, RULES)) == [(60, "raised", "underfed"), (299, "cleared", "underfed")]
    # a recording that ends in its gap (the recorder died): cleared where it died
    stopped = recording(range(0, 300), gaps=[Gap(T0 + 299, T0 + 4000)])
    assert said(host_alert_times("box", stopped, T0, T0 + 4000, RULES)) == [(60, "raised", "underfed"), (299, "cleared", "underfed")]


def test_a_few_seconds_without_a_sample_that_are_no_gap_do_not_break_the_stretch():
    rec = recording([*range(0, 102), *range(108, 300)])  # nvidia-smi late by 6 s: no gap declared
    assert said(host_alert_times("box", rec, T0, T0 + 300, RULES)) == [(60, "raised", "underfed")]


def test_one_minute_means_turning_to_samples_keep_the_stretch():
    rec = recording([*range(0, 600, 60), *range(600, 700)], coarse_before=T0 + 600)
    assert said(host_alert_times("box", rec, T0, T0 + 700, RULES)) == [(60, "raised", "underfed")]


def run(events, ended=None, exit_status=None, relaunched=None) -> RunPast:
    phase = RunPhase.RUNNING if ended is None else RunPhase.EXITED
    info = RunInfo("r1", "s1", "box", phase, exit_status=exit_status)
    return RunPast("box/r1", info, [{**e, "time": T0 + e["time"]} for e in events], None if ended is None else T0 + ended,
                   None if relaunched is None else T0 + relaunched)  # fmt: skip


def steps(n: int, every: float = 1.0) -> list[dict]:
    return [{"event": "step", "step": k, "time": k * every, "loss": 2.0} for k in range(1, n + 1)]


def test_an_oom_stands_while_the_process_hangs_and_is_said_once():
    events = [*steps(100), {"event": "oom", "time": 100.5}]
    found = said(run_alert_times(run(events, ended=700, exit_status=3), T0 + 800, Rules(stall_floor_s=300)))
    assert found == [(100.5, "raised", "oom")]


def test_events_in_the_last_second_of_a_run_come_before_its_end():
    # the exit's time is its file's mtime, whole seconds: 100 for an exit at 100.6
    events = [*steps(99), {"event": "nonfinite", "time": 100.3, "step": 100, "in_a_row": 1}]
    found = said(run_alert_times(run(events, ended=100, exit_status=4), T0 + 200))
    assert found == [(100.3, "raised", "skipping"), (100.3, "cleared", "skipping"), (100.3, "raised", "failed")]


def test_a_failure_is_news_until_a_relaunch_answers_it_and_none_when_the_relaunch_came_first():
    later = said(run_alert_times(run(steps(10), ended=100, exit_status=1, relaunched=3000), T0 + 4000))
    assert later == [(100, "raised", "failed"), (3000, "cleared", "failed")]
    assert said(run_alert_times(run(steps(10), ended=100, exit_status=1, relaunched=99), T0 + 4000)) == []
    # a relaunch after the span read is not known yet
    assert said(run_alert_times(run(steps(10), ended=100, exit_status=1, relaunched=3000), T0 + 2000)) == [(100, "raised", "failed")]


def test_a_foreign_sessions_end_is_where_its_log_last_grew_not_where_the_index_said_it_again():
    """The recorder says every log's size again at each new day file and restart: a session
    dead since before the span is not taken to have ended at midnight inside it."""
    from backends.history.missed import _foreign_run
    from backends.logs.recording import recording_of
    from backends.recorder.read import LogSize
    from backends.tmux import Pane

    pane = Pane("trainer", 4242, True, 1, pane_id="%3", created=1_799_000_000)
    log = recording_of("/runs", None, pane).log.removeprefix("/runs/")
    info = RunInfo(None, "trainer", "box", RunPhase.EXITED, exit_status=1)

    def ended(*sizes: tuple[float, int]) -> float | None:
        rec = Recording(gpus=(), procs=(), panes=(), logs=tuple(LogSize(T0 + t, log, n) for t, n in sizes), gaps=(), coarse_before=None)
        return _foreign_run(info, "box/trainer", [pane], "/runs", None, rec).ended

    assert ended((0, 500), (7200, 500)) is None  # said again at midnight, never grew in the span
    assert ended((0, 500), (60, 900), (120, 1400), (7200, 1400)) == T0 + 120


def test_a_watcher_started_later_says_what_is_up_then_in_its_words_then_and_nothing_of_a_run_over_before():
    stalled = run(steps(10))  # silent since step 10, still running
    assert [(round(at - T0), word, alert.text) for at, word, alert in run_alert_times(stalled, T0 + 7210, since=T0 + 7210)] == [
        (7210, "raised", "box/r1 stalled: no step for 2h00m")]
    # one that cleared before the watcher started is not said; one that came after is
    events = [*steps(10), *({"event": "step", "step": k, "time": 990 + k, "loss": 2.0} for k in range(11, 211))]
    assert said(run_alert_times(run(events), T0 + 2000)) == [(311, "raised", "stall"), (1001, "cleared", "stall"), (1501, "raised", "stall")]
    assert said(run_alert_times(run(events), T0 + 2000, since=T0 + 1100)) == [(1501, "raised", "stall")]
    assert run_alert_times(run(steps(10), ended=100, exit_status=1), T0 + 9000, since=T0 + 200) == []
