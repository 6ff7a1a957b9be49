"""Charging GPU time and energy to runs from a recording (backends/recorder/energy.py):
by process ancestry to the run's own panes, never by a name; split by memory where a card
is shared; lower bounds, never guesses, where the recording cannot say."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from backends.recorder.energy import OVERLAP_S, STEP_S, Charge, Ledger, RunIdentity, charge
from backends.recorder.read import Gap, GpuSample, PaneSample, ProcSample, Recording

GPU0, GPU1 = "GPU-aaaa", "GPU-bbbb"
RUN = RunIdentity("", "train", frozenset({100}), since=0.0)
OTHER = RunIdentity("", "other", frozenset({200}), since=0.0)


def readings(uuid: str, times, power=300.0) -> list[GpuSample]:
    return [GpuSample(float(t), 0 if uuid == GPU0 else 1, uuid, power(t) if callable(power) else power, 600.0, 1000.0, 80000.0, 90.0)
            for t in times]  # fmt: skip


def listing(times, *procs: tuple) -> list[ProcSample]:
    """At each time, each (gpu, pid, start ticks, MiB, ancestors)."""
    return [ProcSample(float(t), gpu, pid, ticks, mib, anc) for t in times for gpu, pid, ticks, mib, anc in procs]


def panes(times, *sessions: tuple) -> list[PaneSample]:
    """At each time, each (socket, session, pane pid)."""
    return [PaneSample(float(t), socket, session, pid) for t in times for socket, session, pid in sessions]


def recording(gpus=(), procs=(), pane_list=(), gaps=(), coarse_before=None, empty=()) -> Recording:
    """Snapshots at their rows' times, and of nothing at the times `empty`."""
    proc_times = tuple(sorted({p.time for p in procs} | set(empty)))
    return Recording(tuple(gpus), tuple(procs), tuple(pane_list), (), tuple(gaps), coarse_before, proc_times,
                     tuple(sorted({p.time for p in pane_list})))  # fmt: skip


EVERY_5 = range(0, 101, 5)
EVERY_5_TO_400 = range(0, 401, 5)
TRAINER = (GPU0, 1234, 5000, 40000.0, (1200, 100, 1))  # python under the pane's shell
BOTH_PANES = (("", "train", 100), ("", "other", 200))


def test_a_run_is_charged_its_gpu_time_and_energy():
    rec = recording(readings(GPU0, range(101)), listing(EVERY_5, TRAINER), panes(EVERY_5, *BOTH_PANES))
    c = charge(rec, {"r": RUN})["r"]
    assert c.gpu_s == pytest.approx(100.0)
    assert c.joules == pytest.approx(300.0 * 100)
    assert c.kwh == pytest.approx(300.0 * 100 / 3.6e6)
    assert not c.at_least and not c.shared


def test_power_is_integrated_between_readings():
    rec = recording(readings(GPU0, range(11), power=lambda t: 100.0 * t), listing([0], TRAINER), panes([0], *BOTH_PANES))
    assert charge(rec, {"r": RUN})["r"].joules == pytest.approx(100.0 * 10 * 10 / 2)  # the ramp's area


def test_a_forged_session_or_process_name_is_not_charged():
    """A bystander's session named as the run's on another tmux server, its pane's pid the
    run's pane's once that ended; on the run's server a session of the run's name whose
    pane is not the one the run's manifest names (its session ended and the name was
    taken); a process named after the run: none is the run's."""
    forged = [
        (GPU0, 1234, 5000, 40000.0, (900, 1)),  # under a same-named session on another socket
        (GPU0, 1300, 5100, 40000.0, (901, 1)),  # under a pane of `train` that is not the run's
        (GPU0, 1400, 5200, 40000.0, (1,)),  # "train" in its process name: names are not read
        (GPU1, 1500, 5300, 40000.0, (100, 1)),  # under pid 100, the other server's pane now
    ]
    rec = recording(
        readings(GPU0, range(101)) + readings(GPU1, range(101)),
        listing(EVERY_5, *forged),
        panes(EVERY_5, ("evil", "train", 900), ("", "train", 901), ("evil", "train", 100)),
    )
    assert charge(rec, {"r": RUN})["r"] == Charge()


def test_a_session_trackside_did_not_launch_is_charged_through_the_panes_it_was_seen_with():
    foreign = RunIdentity("", "train", frozenset({901, 902}))
    rec = recording(readings(GPU0, range(101)), listing(EVERY_5, (GPU0, 1234, 5000, 1.0, (901, 1))), panes(EVERY_5, ("", "train", 901)))
    assert charge(rec, {"f": foreign})["f"].gpu_s == pytest.approx(100.0)


def test_an_orphaned_worker_stays_the_runs_but_a_reused_pid_does_not():
    """Pid 1234 was proven the run's, then its parent died (orphaned to init): still the run's
    while it lives as itself; at 50 s the pid is another process's (another start time)."""
    rec = recording(
        readings(GPU0, range(101)),
        listing(range(0, 21, 5), TRAINER)
        + listing(range(25, 50, 5), (GPU0, 1234, 5000, 40000.0, (1,)))
        + listing(range(50, 101, 5), (GPU0, 1234, 9999, 40000.0, (1,))),
        panes(EVERY_5, *BOTH_PANES),
    )
    c = charge(rec, {"r": RUN})["r"]
    assert c.gpu_s == pytest.approx(50.0)
    assert not c.at_least


def test_a_process_moved_to_another_session_is_charged_there_from_then():
    """tmux moved the run's pane (its process and the trainer under it) into session
    `other` at 50 s: the pane pid is now listed there."""
    rec = recording(
        readings(GPU0, range(101)),
        listing(EVERY_5, TRAINER),
        panes(range(0, 50, 5), *BOTH_PANES) + panes(range(50, 101, 5), ("", "other", 100), ("", "other", 200)),
    )
    moved = RunIdentity("", "other", frozenset({100, 200}))
    charged = charge(rec, {"r": RUN, "o": moved})
    assert charged["r"].gpu_s == pytest.approx(50.0)
    assert charged["o"].gpu_s == pytest.approx(50.0)


def test_a_gap_is_not_charged_and_makes_a_lower_bound():
    times = [t for t in range(101) if not 40 < t < 60]
    rec = recording(readings(GPU0, times), listing(EVERY_5, TRAINER), panes(EVERY_5, *BOTH_PANES), gaps=[Gap(40.5, 59.5)])
    c = charge(rec, {"r": RUN})["r"]
    assert c.gpu_s == pytest.approx(80.0)
    assert c.joules == pytest.approx(300.0 * 80)
    assert c.at_least
    # A restart the reader found between two readings a second apart: still a gap.
    restart = recording(readings(GPU0, range(101)), listing(EVERY_5, TRAINER), panes(EVERY_5, *BOTH_PANES), gaps=[Gap(40.2, 40.8)])
    c = charge(restart, {"r": RUN})["r"]
    assert c.gpu_s == pytest.approx(99.0) and c.at_least


def test_readings_too_far_apart_are_a_gap_though_none_was_recorded():
    times = [*range(0, 41), *range(41 + int(STEP_S) + 5, 101)]
    rec = recording(readings(GPU0, times), listing(EVERY_5, TRAINER), panes(EVERY_5, *BOTH_PANES))
    c = charge(rec, {"r": RUN})["r"]
    assert c.gpu_s == pytest.approx(100.0 - (times[41] - 40))
    assert c.at_least


def test_a_snapshot_holds_until_the_next_and_none_before_the_first_is_a_lower_bound():
    """The recorder writes a snapshot when it changes: the trainer's holds from 20 s until
    the snapshot of no process at 70 s. The first snapshot stands for the readings of the
    step before it too (the recorder lists processes a moment after its first GPU reading);
    before that nobody knows."""
    rec = recording(readings(GPU0, range(101)), listing([20], TRAINER), panes([20], *BOTH_PANES), empty=[70.0])
    c = charge(rec, {"r": RUN})["r"]
    assert c.gpu_s == pytest.approx(50.0 + STEP_S + 1)  # the readings from 14 s: the interval ending 15 s on
    assert c.at_least
    started = recording(readings(GPU0, range(101)), listing([0.4], TRAINER), panes([0.4], *BOTH_PANES), empty=[70.0])
    assert charge(started, {"r": RUN})["r"] == Charge(70.0, 300.0 * 70)


def test_a_gpu_shared_by_two_runs_is_split_by_used_memory():
    rec = recording(
        readings(GPU0, range(101)),
        listing(EVERY_5, (GPU0, 1234, 5000, 30000.0, (100, 1)), (GPU0, 2234, 6000, 10000.0, (200, 1))),
        panes(EVERY_5, *BOTH_PANES),
    )
    charged = charge(rec, {"r": RUN, "o": OTHER})
    assert charged["r"].gpu_s == pytest.approx(75.0) and charged["o"].gpu_s == pytest.approx(25.0)
    assert charged["r"].joules == pytest.approx(300.0 * 75)
    assert charged["r"].shared and charged["o"].shared


def test_a_bystanders_share_is_nobodys_and_a_split_unknown_is_not_guessed():
    rec = recording(
        readings(GPU0, range(101)) + readings(GPU1, range(101)),
        listing(EVERY_5, (GPU0, 1234, 5000, 30000.0, (100, 1)), (GPU0, 7000, 1, 30000.0, (1,)),
                (GPU1, 1235, 5000, None, (100, 1)), (GPU1, 7001, 1, 500.0, (1,))),
        panes(EVERY_5, *BOTH_PANES),
    )  # fmt: skip
    c = charge(rec, {"r": RUN})["r"]
    assert c.gpu_s == pytest.approx(50.0)  # half of GPU0; GPU1's split cannot be known
    assert c.shared and c.at_least


def test_a_gpu_with_no_process_is_charged_to_nobody():
    rec = recording(readings(GPU0, range(101)) + readings(GPU1, range(101)), listing(EVERY_5, TRAINER), panes(EVERY_5, *BOTH_PANES))
    assert charge(rec, {"r": RUN})["r"].gpu_s == pytest.approx(100.0)  # GPU1 idle: not the run's


def test_power_not_available_counts_the_time_but_no_guessed_energy():
    rec = recording(
        readings(GPU0, range(101), power=lambda t: None if 20 <= t <= 30 else 300.0),
        listing(EVERY_5, TRAINER), panes(EVERY_5, *BOTH_PANES),
    )  # fmt: skip
    c = charge(rec, {"r": RUN})["r"]
    assert c.gpu_s == pytest.approx(100.0)
    assert c.joules == pytest.approx(300.0 * (100 - 12))  # the intervals touching 20..30 are unknown
    assert c.at_least


@pytest.mark.parametrize("bad", [math.nan, math.inf, -5.0])
def test_a_power_no_card_reads_is_not_charged(bad):
    rec = recording(readings(GPU0, range(11), power=bad), listing([0], TRAINER), panes([0], *BOTH_PANES))
    c = charge(rec, {"r": RUN})["r"]
    assert c.joules == 0.0 and c.at_least


def test_only_the_runs_own_span_is_charged_and_a_start_before_the_recording_is_a_lower_bound():
    rec = recording(readings(GPU0, range(101)), listing(EVERY_5, TRAINER), panes(EVERY_5, *BOTH_PANES))
    late = RunIdentity("", "train", frozenset({100}), since=30.0, until=70.5)
    assert charge(rec, {"r": late})["r"] == Charge(40.5, 300.0 * 40.5)
    early = RunIdentity("", "train", frozenset({100}), since=-3600.0)
    assert charge(rec, {"r": early})["r"].at_least


def test_a_ledger_read_on_in_pieces_charges_what_one_reading_does():
    """Readings that end at any moment, a card read half a second after the other, and a
    run that the ledger meets only later: charged as one reading of it all charges them."""
    rec = recording(
        readings(GPU0, range(301), power=lambda t: 200.0 + t) + readings(GPU1, [t + 0.5 for t in range(300)]),
        listing(range(0, 301, 5), TRAINER, (GPU1, 1236, 5001, 100.0, (1234, 1200, 100, 1)),
                (GPU1, 2236, 6001, 300.0, (200, 1))),
        panes(range(0, 301, 5), *BOTH_PANES),
    )  # fmt: skip
    ledger = Ledger()
    for until in (37.2, 38.0, 120.4, 250.0, 301.0):
        runs = {"r": RUN, **({"o": OTHER} if until > 200 else {})}
        since = ledger.read_from(runs)
        part = recording(*(tuple(x for x in items if since <= x.time <= until) for items in (rec.gpus, rec.procs, rec.panes)))
        ledger.add(part, runs)
    assert ledger.done == 299.5  # the time every card has read through; the rest comes with the next readings
    whole = charge(rec, {"r": RUN, "o": OTHER}, end=ledger.done)
    for key in ("r", "o"):
        assert ledger.charges[key].gpu_s == pytest.approx(whole[key].gpu_s)
        assert ledger.charges[key].joules == pytest.approx(whole[key].joules)
    assert ledger.charges["o"].gpu_s == pytest.approx(299 * 0.75)


def test_a_ledger_reads_a_new_run_from_its_start():
    ledger = Ledger(done=1000.0, charges={"r": Charge()})
    assert ledger.read_from({"r": RUN}) == 1000.0 - OVERLAP_S
    assert ledger.read_from({"r": RUN, "n": RunIdentity("", "t", frozenset({1}), since=500.0)}) == 500.0 - OVERLAP_S
    assert ledger.read_from({"f": RunIdentity("", "t", frozenset({1}))}) == 0.0  # a start not known: from the beginning


def test_a_ledger_whose_recorder_stopped_recording_is_a_lower_bound():
    """The reader's gap from the last reading to now: the recorder died, and the run goes on
    unrecorded (the next command restarts it)."""
    rec = recording(readings(GPU0, range(101)), listing(EVERY_5, TRAINER), panes(EVERY_5, *BOTH_PANES))
    ledger = Ledger()
    ledger.add(rec, {"r": RUN})
    assert ledger.charges["r"] == Charge(100.0, 300.0 * 100)
    stopped = recording(readings(GPU0, range(95, 101)), listing([95], TRAINER), panes([95], *BOTH_PANES), gaps=[Gap(100.0, 160.0)])
    ledger.add(stopped, {"r": RUN})
    assert ledger.charges["r"] == Charge(100.0, 300.0 * 100, at_least=True)


def test_a_ledger_catching_up_on_a_reading_cut_short_says_lower_bounds_until_it_has():
    """A reading cut by the reader's cap (Recording.read_to): what is charged so far is
    less than the run's time so far, until the readings after it have caught up."""
    rec = recording(readings(GPU0, range(201)), listing(EVERY_5, TRAINER), panes(EVERY_5, *BOTH_PANES))
    ledger = Ledger()
    first = recording(*(tuple(x for x in items if x.time <= 100) for items in (rec.gpus, rec.procs, rec.panes)))
    ledger.add(replace(first, read_to=100.0), {"r": RUN})
    assert ledger.said()["r"] == Charge(100.0, 300.0 * 100, at_least=True)
    since = ledger.read_from({"r": RUN})
    ledger.add(recording(*(tuple(x for x in items if x.time >= since) for items in (rec.gpus, rec.procs, rec.panes))), {"r": RUN})
    assert ledger.said()["r"] == Charge(200.0, 300.0 * 200)


def test_a_run_met_late_is_charged_its_past_a_cut_reading_at_a_time():
    """A run the ledger meets once it has read to 300 s, begun at 0: the readings from its
    start are cut short by the reader's cap, each read on from where the last ended, until
    it is charged as one reading of it all would."""
    rec = recording(readings(GPU0, range(401)) + readings(GPU1, range(401)),
                    listing(EVERY_5_TO_400, TRAINER, (GPU1, 2236, 6001, 300.0, (200, 1))),
                    panes(EVERY_5_TO_400, *BOTH_PANES))  # fmt: skip

    def part(since: float, until: float, cut: bool) -> Recording:
        got = recording(*(tuple(x for x in items if since <= x.time <= until) for items in (rec.gpus, rec.procs, rec.panes)))
        return replace(got, read_to=until if cut else None)

    ledger = Ledger()
    ledger.add(part(0, 300, False), {"r": RUN})
    runs = {"r": RUN, "o": OTHER}
    readings_taken = 0
    while readings_taken < 20:
        since = ledger.read_from(runs)
        until = min(since + 100, 400)
        ledger.add(part(since, until, until < 400), runs)
        readings_taken += 1
        if until == 400:
            break
    assert readings_taken == 5 and not ledger.marks and ledger.done == 400
    whole = charge(rec, runs, end=400)
    for key in runs:
        assert ledger.said()[key].gpu_s == pytest.approx(whole[key].gpu_s) and not ledger.said()[key].at_least
    assert ledger.said()["o"].gpu_s == pytest.approx(400)
