"""Release first, write after: a trainer stopped by SIGTERM exits before its checkpoint is
durable, a writer process of its own makes it so, and nothing half-written is ever read:
`--resume` reads the state from the writer's RAM meanwhile (training/ram_stage.py), or
waits for the writer, and its first save waits for it; a trainer or writer killed at any
moment leaves the newest checkpoint either whole or absent (the one before it then the
latest).

Real trainers (`python -m training train --synthetic`), real files; the writer is caught
mid-write by watching its marker (checkpoints/.writing names its pid) and stopped with
SIGSTOP, or killed with SIGKILL, at that moment."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.training.test_checkpoint import ROOT, after_start, env, events, started, wait_for
from tests.waiting import HANG_S, niced
from training import checkpoint, durable
from training.contract import WRITER_NAME, WRITING_MARKER

RUN = ["train", "--synthetic", "--steps", "5000", "--max-seq-len", "128", "--ttt-steps", "2",
       "--save-every", "25"]


def start(run_dir: Path, environ: dict, *extra: str) -> subprocess.Popen:
    """The trainer, its output in a file (`said`): a pipe nobody reads would fill."""
    run_dir.mkdir(parents=True, exist_ok=True)
    log = run_dir / f"said-{time.monotonic_ns()}.txt"
    with open(log, "w") as out:
        proc = subprocess.Popen(niced([sys.executable, "-m", "training", *RUN, "--out", str(run_dir), *extra]),
                                cwd=ROOT, env=environ, stdout=out, stderr=subprocess.STDOUT)
    proc.log = log
    return proc


def said(proc: subprocess.Popen) -> str:
    return proc.log.read_text()


def steps(run_dir: Path) -> int:
    return sum(e["event"] == "step" for e in events(run_dir))


def writer_pid(ckpt: Path) -> int | None:
    """The pid in the writer's marker, the moment it is there."""
    try:
        return json.loads((ckpt / WRITING_MARKER).read_text())["pid"]
    except (OSError, ValueError):
        return None


def signal_writer(pid: int, sig: int) -> bool:
    """Signal checkpoint writer `pid`, only if that pid is still a checkpoint writer (a pid
    reused since the marker was read would be some other process); whether it was sent."""
    try:
        handle = os.pidfd_open(pid)  # from here on, this very process or nothing
    except ProcessLookupError:
        return False
    try:
        if Path(f"/proc/{pid}/comm").read_text().strip() != WRITER_NAME:
            return False
        signal.pidfd_send_signal(handle, sig)
        return True
    except (ProcessLookupError, FileNotFoundError):
        return False
    finally:
        os.close(handle)


def staged_step(run_dir: Path) -> int | None:
    return next((e["step"] for e in reversed(events(run_dir)) if e["event"] == "staged"), None)


def complete_checkpoints_only(ckpt: Path) -> int:
    """Every step directory reads back whole; the step `--resume` would take."""
    for _, path in durable.step_dirs(ckpt):
        _, state, _ = checkpoint.load(path)
        assert state["step"] == int(path.name.removeprefix("step-"))
    return int(checkpoint.latest(ckpt).name.removeprefix("step-"))


def resumes_at(run_dir: Path, environ: dict, step: int) -> subprocess.Popen:
    before = len(events(run_dir))
    proc = start(run_dir, environ, "--resume")
    assert after_start(run_dir, lambda: len(events(run_dir)) > before + 1, 60, before), proc.poll()
    resumed = events(run_dir)[before:]
    assert resumed[0]["event"] == "start" and resumed[0]["config"]["resumed_from_step"] == step
    assert resumed[1]["event"] == "step" and resumed[1]["step"] == step + 1
    return proc


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, said(proc)


@pytest.mark.slow
@pytest.mark.timeout(900)  # up to six trainer starts, each as long as the machine's load makes it
def test_the_trainer_exits_before_its_checkpoint_is_durable_and_resume_reads_it_from_ram_then_waits_to_save(
        tmp_path, tmp_path_factory):
    run_dir, ckpt = tmp_path / "run", tmp_path / "run" / "checkpoints"
    environ = env(tmp_path_factory)
    proc = start(run_dir, environ)
    assert after_start(run_dir, lambda: checkpoint.latest(ckpt) is not None and steps(run_dir) > 30, 60)
    caught = 0
    for trial in range(5):  # the writer is stopped before it is done in most of them
        proc.send_signal(signal.SIGTERM)
        # Polled, not woken by inotify: the writer must be caught within its few
        # milliseconds of writing, and a wake-up came after it had finished.
        assert wait_for(lambda: writer_pid(ckpt) is not None, 30, poll=0.0002)
        writer = writer_pid(ckpt)
        # Not sent: done already (a small state is written in milliseconds): not caught, below.
        signal_writer(writer, signal.SIGSTOP)
        try:
            # the trainer exits, its writer stopped
            assert proc.wait(timeout=30) == 0, said(proc)
            step = max(e["step"] for e in events(run_dir) if e["event"] == "step")
            # Not caught: the writer had finished, or was stopped before it said it was
            # ready (the trainer then killed it and wrote the checkpoint itself).
            if (ckpt / f"step-{step}").exists():
                # Its step is in place, but a writer stopped after the rename still holds the
                # lock (to repoint `latest`): the resume would wait its 120 s and give up. Let
                # it finish, its checkpoint event written before the resume's start.
                signal_writer(writer, signal.SIGCONT)
                assert wait_for(lambda: any(e["event"] == "checkpoint" and e["step"] == step for e in events(run_dir)), 30)
                proc = resumes_at(run_dir, environ, step)
                continue
            assert staged_step(run_dir) == step
            caught += 1
            assert complete_checkpoints_only(ckpt) < step  # the one before is the latest
            assert not any(e["event"] == "checkpoint" and e["step"] == step for e in events(run_dir))
            before = len(events(run_dir))
            waiting = start(run_dir, environ, "--resume")
            what = f"step {step}'s checkpoint (writer pid {writer})"
            # It goes on from the writer's RAM (training/ram_stage.py), until its first save,
            # which waits for that writer (a save sweeps what a live writer still needs).
            assert after_start(run_dir, lambda: f"waiting up to 120 s for {what} to be durable" in said(waiting),
                               HANG_S, before), said(waiting)
            resumed = events(run_dir)[before:]
            assert resumed[0]["event"] == "start" and resumed[0]["config"]["resumed_from_step"] == step
            assert resumed[0]["resume_source"] == "ram" and resumed[1]["step"] == step + 1
            saving = resumed[-1]["step"]  # it trains no further while it waits to save
            assert saving % 25 == 0 and not any(e["event"] == "checkpoint" for e in resumed)
            assert complete_checkpoints_only(ckpt) < step  # nothing half-written in place
        finally:
            signal_writer(writer, signal.SIGCONT)  # not sent: its trainer killed it, not ready in time
        # The writer finishes; the waiting save then writes its own, and the run goes on.
        assert wait_for(lambda: [e["step"] for e in events(run_dir)[before:] if e["event"] == "checkpoint"]
                        == [step, saving], 60), events(run_dir)[before:]
        assert wait_for(lambda: any(e["event"] == "step" and e["step"] > saving for e in events(run_dir)), 60)
        assert f"{what} is durable" in said(waiting)
        proc = waiting
    stop(proc)
    assert caught >= 1


@pytest.mark.slow
@pytest.mark.timeout(900)  # nine trainer starts, each as long as the machine's load makes it
def test_kill_9_of_the_trainer_while_staging_or_of_the_writer_mid_write_leaves_whole_checkpoints(
        tmp_path, tmp_path_factory):
    run_dir, ckpt = tmp_path / "run", tmp_path / "run" / "checkpoints"
    environ = env(tmp_path_factory)
    rng = random.Random(33)
    proc = start(run_dir, environ)
    assert started(run_dir)  # the later trainers' starts: in resumes_at
    lost = 0
    for trial in range(8):
        assert wait_for(lambda: checkpoint.latest(ckpt) is not None and steps(run_dir) > 30, 60)
        previous = complete_checkpoints_only(ckpt)
        before = len(events(run_dir))
        proc.send_signal(signal.SIGTERM)
        if trial % 2:  # the writer, at a moment of its write (polled: see above)
            assert wait_for(lambda: writer_pid(ckpt) is not None, 30, poll=0.0002)
            writer = writer_pid(ckpt)
            time.sleep(rng.uniform(0, 0.01))
            if writer is not None:  # None: done already, this trial's write not cut (nor if not sent)
                signal_writer(writer, signal.SIGKILL)
            proc.wait(timeout=30)
        else:  # the trainer, from its stop to its hand-over
            time.sleep(rng.uniform(0, 0.05))
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        durable.wait_for_writer(ckpt, print, timeout_s=30)  # a writer it had started
        latest = complete_checkpoints_only(ckpt)
        stopped_at = [e["step"] for e in events(run_dir)[before:] if e["event"] == "step"][-1:]
        assert latest in (previous, *stopped_at), (latest, previous, stopped_at)
        lost += latest == previous
        proc = resumes_at(run_dir, environ, latest)
    stop(proc)
    assert lost >= 1  # a write was cut short at least once, and its run resumed
    # Its debris (a half staging in /dev/shm, a half .tmp-step) went with the next save.
    durable.wait_for_writer(ckpt, print, timeout_s=30)
    assert not list(durable.SHM.glob(durable._shm_staging(ckpt) + "*"))
    assert not [p.name for p in ckpt.iterdir() if p.name.startswith((".tmp-", WRITING_MARKER))]
