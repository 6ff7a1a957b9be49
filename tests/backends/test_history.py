"""backends/history: a run at a moment (its events, its log by the recording's size
index, its GPUs), the moments that matter, and `--at`; on their own, without Textual."""

from __future__ import annotations

import json
import time

import pytest

from backends.alerts import Rules
from backends.history import History, Tape, WhenError, frame_at, moments_of, parse_when
from backends.history.read import parse_events, parse_stops
from backends.recorder import read as reader
from backends.recorder.read import Gap, GpuSample
from backends.history.tape import MAX_TAIL_BYTES
from backends.sanitize import LINE_CAP


def Recording(gpus=(), logs=(), gaps=(), coarse_before=None) -> reader.Recording:  # noqa: N802 - the reader's, with defaults
    return reader.Recording(gpus=tuple(gpus), procs=(), panes=(), logs=tuple(logs), gaps=tuple(gaps), coarse_before=coarse_before)


T0 = 1_800_000_000.0


def lines(*events: dict) -> str:
    return "".join(json.dumps(e) + "\n" for e in events)


def test_the_log_at_a_moment_is_the_file_cut_at_its_recorded_size():
    data = b"".join(b"line %d\n" % i for i in range(10))
    sizes = [(T0 + i, len(b"".join(b"line %d\n" % k for k in range(i + 1)))) for i in range(10)]
    tape = Tape("r/console.log", current=data, sizes=sizes)
    assert tape.log_at(T0 + 3.5, 2).lines == ("line 2", "line 3")
    assert tape.log_at(T0 + 100, 3).lines == ("line 7", "line 8", "line 9")
    before = tape.log_at(T0 - 1, 3)
    assert before.lines == () and "before this log's recording began" in before.note


def test_a_size_before_a_turn_reads_the_older_segment_and_before_two_turns_is_gone():
    older, current = b"a1\na2\n", b"b1\n"
    # live file sizes: 5 (a segment lost since: two turns after it), a turn, 2 and 6 (what
    # is now .1), a turn, 3 (the live file)
    sizes = [(T0, 5), (T0 + 1, 2), (T0 + 2, 6), (T0 + 3, 3)]
    tape = Tape("p/1.log", current=current, older=older, before=b"scroll\n", sizes=sizes)
    assert tape.log_at(T0 + 1.5, 5).lines == ("scroll", "a1")
    assert tape.log_at(T0 + 2.5, 5).lines == ("scroll", "a1", "a2")
    assert tape.log_at(T0 + 3.5, 5).lines == ("scroll", "a1", "a2", "b1")
    lost = tape.log_at(T0 + 0.5, 5)
    assert lost.lines == () and "rotated away" in lost.note


def test_hostile_logs_never_hang_or_crash():
    # a size past the file's end (changed since): held to the file, and said
    tape = Tape("x.log", current=b"one\ntwo\n", sizes=[(T0, 1 << 40)])
    got = tape.log_at(T0, 10)
    assert got.lines == ("one", "two") and "past the file's end" in got.note
    # a huge line with no end: cut, fast
    huge = Tape("h.log", current=b"x" * (3 * MAX_TAIL_BYTES) + b"\nend\n", sizes=[(T0, 3 * MAX_TAIL_BYTES + 5)])
    started = time.monotonic()
    shown = huge.log_at(T0, 5).lines
    assert shown[-1] == "end" and len(shown[0]) <= LINE_CAP + 1 and time.monotonic() - started < 5
    # garbage: invalid UTF-8, escapes, NULs, negative sizes
    junk = Tape("g.log", current=b"\xff\xfe\x00\x1b[2J\x1b]0;title\x07ok\r\nnext\n", sizes=[(T0, -5), (T0 + 1, 40)])
    assert junk.log_at(T0, 5).lines == ()
    assert junk.log_at(T0 + 1, 5).lines[-1] == "next"
    assert all("\x1b" not in line for line in junk.log_at(T0 + 1, 5).lines)


def test_a_console_fold_at_a_moment_holds_only_the_steps_printed_by_then():
    text = b"".join(b"step %d loss %.1f\n" % (i, 5 - i / 10) for i in range(1, 41))
    ends = [text.index(b"step %d " % i) for i in range(2, 41)] + [len(text)]
    tape = Tape("p.log", current=text, sizes=[(T0 + i, end) for i, end in enumerate(ends, 1)])
    assert tape.console_at(T0 + 10).step == 10
    assert tape.console_at(T0 + 40).step == 40
    assert tape.console_at(T0 + 5).step == 5  # back again, from a fold kept
    assert len(tape.console_at(T0 + 5).curve) == 5


def history(events: str = "", *, recording=None, tape=None, ended=True, stops=(), relaunches=(), exit_status=None) -> History:
    parsed, garbled = parse_events(events)
    times = [e["time"] for e in parsed] or [T0]
    h = History("20261206-0100-ab12", "box", "20261206-0100-ab12", "s", min(times), max(times), ended, parsed, garbled,
                tape=tape, stops=list(stops), relaunches=list(relaunches), exit_status=exit_status)
    h.record(recording)
    return h


def step(n: int, t: float, loss: float = 2.0) -> dict:
    return {"event": "step", "time": t, "step": n, "loss": loss, "tokens": 100}


def test_events_at_a_moment_and_a_gap_in_the_gpus_is_a_gap():
    events = lines({"event": "start", "time": T0, "config": {}}, *(step(n, T0 + n) for n in range(1, 11)))
    gpus = tuple(GpuSample(T0 + t, 0, "GPU-a", 300.0 + t, 700.0, 1000.0, 80000.0, 99.0) for t in [*range(0, 5), *range(20, 24)])
    h = history(events, recording=Recording(gpus=gpus, gaps=(Gap(T0 + 5, T0 + 20),)))
    f = frame_at(h, T0 + 3.5, log_lines=10, history_samples=120)
    assert [e.get("step") for e in f.events] == [None, 1, 2, 3]
    assert f.gpus[0].sample.power_w == 303.0 and f.gpu_note == ""
    inside = frame_at(h, T0 + 6, log_lines=10, history_samples=120)
    assert inside.gpus[0].sample is None and "recorder was down" in inside.gpu_note
    after = frame_at(h, T0 + 22, log_lines=10, history_samples=120)
    # the sparkline holds what came after the gap, never a line across it
    assert after.gpus[0].power_w == (320.0, 321.0, 322.0)
    none = frame_at(history(events), T0 + 3, log_lines=10, history_samples=120)
    assert none.gpus == () and "no GPU recording" in none.gpu_note


def test_the_moments_of_a_run_with_an_oom_skips_a_stall_a_stop_and_a_relaunch():
    events = lines(
        {"event": "start", "time": T0, "config": {}},
        *(step(n, T0 + n) for n in range(1, 11)),
        {"event": "nonfinite", "time": T0 + 11, "step": 11, "what": "loss", "in_a_row": 1},
        step(11, T0 + 12),
        step(12, T0 + 1000),  # silent for 988 s: past the 300 s floor
        step(13, T0 + 1001, loss=60.0),  # past 3× the median
        {"event": "oom", "time": T0 + 1002, "max_seq_len": 32768, "ttt_steps": 5},
        {"event": "end", "time": T0 + 1003, "status": "oom"},
    ) + "not json\n"
    h = history(events, stops=[{"signal": "TERM", "time": T0 + 1004}], relaunches=[("20261206-0120-cd34", T0 + 1010)], exit_status=3)
    assert h.garbled == 1
    said = [(m.time - T0, m.kind) for m in moments_of(h, Rules())]
    assert said == [(0, "start"), (11, "skipping"), (313, "stall"), (1001, "jump"), (1002, "oom"), (1003, "end"),
                    (1003, "exit"), (1004, "stop"), (1010, "relaunch")]
    texts = {m.kind: m.text for m in moments_of(h)}
    assert "skipping 1 steps in a row at step 11" in texts["skipping"]
    assert "ran out of GPU memory (max_seq_len=32768, ttt_steps=5)" in texts["oom"]
    assert texts["relaunch"] == "relaunched as 20261206-0120-cd34"


def test_an_oom_of_a_first_process_is_not_said_again_at_the_end_of_a_second_that_completed():
    """`train A || train B`: A ran out of memory, B (a smaller shape) completed, exit 0."""
    events = lines(
        {"event": "start", "time": T0, "config": {}}, step(1, T0 + 10),
        {"event": "oom", "time": T0 + 20, "max_seq_len": 16384}, {"event": "end", "time": T0 + 21, "status": "oom"},
        {"event": "start", "time": T0 + 30, "config": {}}, step(1, T0 + 40), {"event": "end", "time": T0 + 50, "status": "completed"},
    )
    kinds = [(m.time - T0, m.kind) for m in moments_of(history(events, exit_status=0))]
    assert kinds == [(0, "start"), (20, "oom"), (21, "end"), (30, "start"), (50, "end"), (50, "exit")]


def test_underfed_gpus_and_the_recorders_gaps_are_moments():
    events = lines({"event": "start", "time": T0, "config": {}}, step(1, T0 + 200))
    gpus = tuple(GpuSample(T0 + t, 0, "GPU-a", 100.0, 700.0, 1000.0, 80000.0, 100.0) for t in range(0, 100))
    h = history(events, recording=Recording(gpus=gpus, gaps=(Gap(T0 - 50, T0), Gap(T0 + 120, T0 + 150))))
    kinds = [(m.time - T0, m.kind) for m in moments_of(h)]
    assert (60, "underfed") in kinds and (120, "gap") in kinds
    assert (0, "gap") in kinds and min(kinds)[0] == 0  # the recorder not yet sampling: from the run's start, never before it


def test_stops_from_a_journal_and_nothing_from_garbage():
    journal = json.dumps({"signals": [{"signal": "TERM", "time": T0}, {"signal": "KILL", "time": T0 + 30}, {"signal": "rm -rf", "time": 1}]})
    assert parse_stops(journal) == [{"signal": "TERM", "time": T0}, {"signal": "KILL", "time": T0 + 30}]
    assert parse_stops("[") == parse_stops("42") == parse_stops(None) == []
    # a step whose step or time is no number is no step (the rules compare them)
    events, garbled = parse_events(lines(step(1, T0), {"event": "step", "time": "x", "step": 2}, {"event": "step", "time": T0, "step": "3"}))
    assert [e["step"] for e in events] == [1] and garbled == 2


def test_at_is_absolute_or_relative_and_refused_outside_the_life():
    start, end = T0, T0 + 5 * 3600
    assert parse_when("+30m", start, end) == start + 1800
    assert parse_when("-1h30m", start, end) == end - 5400
    assert parse_when("start", start, end) == start and parse_when("end", start, end) == end
    clock = time.strftime("%H:%M:%S", time.localtime(start + 3723))
    assert parse_when(clock, start, end) == start + 3723
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start + 60))
    assert parse_when(stamp, start, end) == start + 60
    with pytest.raises(WhenError, match=r"before the run's start: its life runs from"):
        parse_when("-6h", start, end)
    with pytest.raises(WhenError, match=r"after the run's end"):
        parse_when("+5h1s", start, end)
    for bad in ("", "yesterday", "+", "25:00", "2026-13-01 10:00", "+1x", "-" + "9" * 40 + "h"):
        with pytest.raises(WhenError):
            parse_when(bad, start, end)


def test_a_runs_life_sums_its_hosts_cards_per_span_and_leaves_a_gap_blank():
    from backends.history.life import life_of

    gpus = tuple(GpuSample(T0 + t, i, f"GPU-{i}", 100.0 * (i + 1), 700.0, 1024.0 * (i + 1), 81920.0, 90.0)
                 for t in [*range(0, 40), *range(60, 100)] for i in range(2))  # fmt: skip
    life = life_of(Recording(gpus=gpus, gaps=(Gap(T0 + 40, T0 + 60),)), T0, T0 + 100, 10)
    assert life.power_w[:4] == (300.0,) * 4 and life.power_w[4:6] == (None, None) and life.power_w[6:] == (300.0,) * 4
    assert life.mem_gib[0] == 3.0 and life.limit_w == 1400.0 and life.total_gib == 160.0 and life.cards == 2
    # samples outside the life are not its
    assert life_of(Recording(gpus=gpus), T0 + 200, T0 + 300, 5).power_w == (None,) * 5


def test_a_hostile_recording_read_by_the_reader_never_hangs_or_crashes_the_replay():
    """The recorder's own files (its reader's format) holding a size past the log's end,
    garbage, a line of megabytes and numbers out of range: the log at each moment is what
    the file holds, the GPU readings those the reader kept."""
    from backends.recorder import agent

    day = agent.day_of(T0)
    path = "20261206-0100-ab12/console.log"
    logs = (f"{T0:.2f},4,{path}\n{T0 + 10:.2f},1000,{path}\n{T0 + 12:.2f},{1 << 70},{path}\n".encode() + b"\xff\xfe garbage\n" + b"9" * (3 << 20) + b"\n"
            + f"{T0 + 20:.2f},-7,{path}\n".encode())  # fmt: skip
    gpu = f"{T0:.2f},0,GPU-0\n{T0 + 1:.2f},0,300,700,1000,81920,99\n{T0 + 2:.2f},0,1e999,700,-5,81920,99\n".encode() + b",,,\n" * 1000
    started = time.monotonic()
    rec = reader.parse_recording({f"{day}.logs": logs, f"{day}.gpu": gpu}, T0 - 60, None, now=T0 + 30)
    h = history(lines(step(1, T0), step(2, T0 + 25)), tape=Tape(path, current=b"one\ntwo\n"))
    h.record(rec)
    from backends.history.read import with_sizes

    with_sizes(h)
    at = [frame_at(h, T0 + dt, log_lines=5, history_samples=10) for dt in (0, 5, 15, 25)]
    assert at[0].log.lines == ("one",) and at[1].log.lines == ("one",)
    assert at[2].log.lines == ("one", "two") and "past the file's end" in at[2].log.note  # held to the file, said
    assert [card.sample.power_w if card.sample else None for card in at[1].gpus] in ([], [None], [300.0])
    assert time.monotonic() - started < 10


def test_a_recording_read_on_holds_each_sample_once_and_its_gaps_as_the_later_read_says():
    from backends.history.life import last_sample, read_on

    def samples(times):
        return tuple(GpuSample(T0 + t, 0, "GPU-0", 100.0, 700.0, 1.0, 2.0, 50.0) for t in times)

    # the first read ended with the recorder quiet (a gap up to that read); the next one,
    # from its last sample on, found it back
    older = Recording(gpus=samples(range(0, 10)), gaps=(Gap(T0 + 9, T0 + 30),))
    assert last_sample(older) == T0 + 9 and last_sample(None) is None
    newer = Recording(gpus=samples([9, *range(40, 50)]), gaps=(Gap(T0 + 9, T0 + 40),))
    both = read_on(older, newer)
    assert [g.time - T0 for g in both.gpus] == [*range(0, 10), *range(40, 50)]
    assert both.gaps == (Gap(T0 + 9, T0 + 40),)
    assert read_on(Recording(), newer) == newer
