"""A resume reads the stopped run's state from its checkpoint writer's RAM while the writer
makes it durable (training/ram_stage.py): the same tensors as the durable checkpoint, from
a real writer held mid-write (its test-only hold, durable.HOLD_ENV); a forged marker is
never taken; a writer killed -9 leaves the reader what it had opened whole, and a later
resume the newest complete checkpoint; a run resumed from RAM into its own directory and
stopped again waits for the old writer before it saves.

Real writer processes, real memfds, real files; real trainers on the CPU for the end to end."""
from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
import torch

from tests.training.test_checkpoint import after_start, env, events, wait_for
from tests.training.test_mirror import built, state_like
from tests.training.test_release_first import said, start
from tests.waiting import HANG_S
from training import checkpoint, durable, ram_stage
from training.contract import WRITING_MARKER
from training.ram_stage import NotOffered
from training.resume import _from_ram

STEP = 12
FILES = (checkpoint.TENSOR_FILES, checkpoint.TEXT_FILES)


class Hold:
    """A FIFO a writer started with durable.HOLD_ENV naming it stops at, after its first
    image is copied out, until this end is opened and closed again."""

    def __init__(self, path: Path):
        os.mkfifo(path)
        self.path, self.end = path, None

    def reached(self, timeout: float = HANG_S) -> bool:
        """Whether the writer came to its hold (opened its end of the FIFO): this end opens
        only then. It stays open, holding it."""
        def opened() -> bool:
            try:
                self.end = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as error:
                if error.errno != errno.ENXIO:  # ENXIO: no reader yet
                    raise
            return self.end is not None
        return wait_for(opened, timeout)

    def release(self) -> None:
        if self.end is not None:
            os.close(self.end)
            self.end = None


def own_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def finished(pid: int) -> int:
    """The exit status of writer `pid`, a child of this test (hand_off started it)."""
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


@pytest.fixture
def held(tmp_path, monkeypatch):
    """A real writer of step STEP into `root`, handed the images of a mirror that its
    trainer (this test) no longer holds, held after its first image; (root, pid, hold,
    the tensors, the state)."""
    root, hold = tmp_path / "checkpoints", Hold(tmp_path / "hold")
    root.mkdir()
    weights, state = state_like()
    state["step"] = STEP
    files, skeleton = checkpoint.tensor_files(weights, state)
    mirror = built({name: {k: torch.zeros_like(t) for k, t in f.items()} for name, f in files.items()})
    images = mirror.fill(files)
    staged = checkpoint.stage(root, STEP, {}, skeleton, {"drafter": {"shape": "test"}}, ram=True)
    monkeypatch.setenv(durable.HOLD_ENV, str(hold.path))
    pid = durable.hand_off(staged, root, STEP, None, images)
    assert pid is not None
    for image in mirror.images.values():  # as a stopped trainer's exit would
        image.release()
        os.close(image.fd)
    assert hold.reached()
    yield root, pid, hold, weights, state
    hold.release()
    try:
        finished(pid)
    except ChildProcessError:  # the test waited for it
        pass


def same(read: tuple, weights: dict, state: dict) -> None:
    got_weights, got_state, config = read
    assert set(got_weights) == set(weights) and all(torch.equal(got_weights[k], t) for k, t in weights.items())
    assert got_state["step"] == STEP and config == {"drafter": {"shape": "test"}}
    assert torch.equal(got_state["rng"]["torch"], state["rng"]["torch"])
    assert torch.equal(got_state["optimizer"]["state"]["b.f32"]["exp_avg"],
                       state["optimizer"]["state"]["b.f32"]["exp_avg"])


def test_a_held_writers_ram_reads_as_the_checkpoint_it_then_makes_durable(held):
    root, pid, hold, weights, state = held
    assert checkpoint.latest(root) is None and (root / f".tmp-step-{STEP}").is_dir()  # mid-write
    with ram_stage.take(root, *FILES) as stage:
        assert (stage.step, stage.pid) == (STEP, pid)
        from_ram = checkpoint.read({name: stage.path(name) for name in stage.fds}, stage.texts)
        images = {name: Path(stage.path(name)).read_bytes() for name in stage.fds}
    same(from_ram, weights, state)
    hold.release()
    assert finished(pid) == 0
    assert checkpoint.latest(root).name == f"step-{STEP}" and not (root / WRITING_MARKER).exists()
    same(checkpoint.load(checkpoint.latest(root)), weights, state)
    for name, image in images.items():  # byte for byte what the RAM held
        assert (root / f"step-{STEP}" / name).read_bytes() == image
    with pytest.raises(NotOffered, match="^$"):  # done: no marker, nothing offered
        ram_stage.take(root, *FILES)


def rewrite(root: Path, marker: dict | bytes) -> None:
    """The marker replaced, as anyone who can write the run dir could."""
    tmp = root / "forged"
    tmp.write_bytes(marker if isinstance(marker, bytes) else json.dumps(marker).encode())
    os.replace(tmp, root / WRITING_MARKER)


def test_a_forged_marker_is_never_taken_and_nothing_of_it_stays_open(held, tmp_path):
    root, pid, hold, weights, state = held
    real = json.loads((root / WRITING_MARKER).read_text())
    image = real["images"][checkpoint.WEIGHTS]
    gone = subprocess.Popen(["true"])
    gone.wait()
    bystander = subprocess.Popen(["sleep", "600"])
    other_root = tmp_path / "other" / "checkpoints"
    other_root.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps(real))

    def with_image(**fields) -> dict:
        return {**real, "images": {**real["images"], checkpoint.WEIGHTS: {**image, **fields}}}

    forged = {
        "is gone": {**real, "pid": gone.pid},
        "is not a checkpoint writer": {**real, "pid": bystander.pid},
        "not a number": {**real, "pid": "1; rm -rf /"},
        "not a descriptor, device, inode and size": with_image(size=2**50),
        "is not the one its marker names": with_image(size=image["size"] + 8),
        "was not handed the descriptors": with_image(fd=image["fd"] + 1),
        "not the writer of step": {**real, "step": STEP + 1},
        "other images": {**real, "images": {checkpoint.WEIGHTS: image}},
        "other files": {**real, "texts": {**real["texts"], "state.pt": ""}},
        "not JSON": b"{" + b" " * 100,
        "not a table": b"[1, 2]",
    }
    before = own_fds()
    try:
        for why, marker in forged.items():
            rewrite(root, marker)
            with pytest.raises(NotOffered, match=why):
                ram_stage.take(root, *FILES)
        (root / WRITING_MARKER).unlink()
        (root / WRITING_MARKER).symlink_to(elsewhere)
        with pytest.raises(NotOffered, match="cannot be read as a file"):
            ram_stage.take(root, *FILES)
        (root / WRITING_MARKER).unlink()
        os.mkfifo(root / WRITING_MARKER)  # opened for reading, a FIFO would hang the reader
        with pytest.raises(NotOffered, match="not a file of a marker's size"):
            ram_stage.take(root, *FILES)
        (root / WRITING_MARKER).unlink()
        with open(root / WRITING_MARKER, "wb") as huge:
            huge.truncate(ram_stage.MARKER_MAX + 1)
        with pytest.raises(NotOffered, match="not a file of a marker's size"):
            ram_stage.take(root, *FILES)
        rewrite(other_root, real)  # a real writer's marker, in another run's checkpoints
        with pytest.raises(NotOffered, match="not the writer of step 12 into"):
            ram_stage.take(other_root, *FILES)
    finally:
        bystander.kill()
        bystander.wait()
    assert own_fds() == before
    rewrite(root, real)
    with ram_stage.take(root, *FILES) as stage:  # the real one still is
        same(checkpoint.read({name: stage.path(name) for name in stage.fds}, stage.texts), weights, state)


def test_a_writer_killed_mid_write_leaves_the_reader_its_images_and_a_resume_the_last_whole_checkpoint(held):
    root, pid, hold, weights, state = held
    before = checkpoint.save(root.parent / "before", STEP - 1, weights, {"step": STEP - 1}, {})  # not in root
    shutil.copytree(before, root / f"step-{STEP - 1}")
    stage = ram_stage.take(root, *FILES)
    try:
        model = checkpoint.read({name: stage.path(name) for name in stage.fds}, stage.texts)[0]
        os.kill(pid, signal.SIGKILL)  # mid-read, and mid-write: its first image copied out
        assert finished(pid) == -signal.SIGKILL
        rest = checkpoint.read({name: stage.path(name) for name in stage.fds}, stage.texts)
    finally:
        stage.close()
    same((model, *rest[1:]), weights, state)
    same(rest, weights, state)
    # Later: the writer gone, its marker and its half copy left; a resume takes neither.
    with pytest.raises(NotOffered, match="is gone"):
        ram_stage.take(root, *FILES)
    assert (root / f".tmp-step-{STEP}" / checkpoint.WEIGHTS).exists()
    told = []
    durable.wait_for_writer(root, told.append, timeout_s=30)
    assert told == [f"step {STEP}'s checkpoint (writer pid {pid}) was lost (the writer ended before it "
                    "was durable): the newest complete checkpoint is the latest"]
    assert checkpoint.latest(root).name == f"step-{STEP - 1}"


def ready_for_a_stop(proc: subprocess.Popen) -> bool:
    return wait_for(lambda: "ready in" in said(proc) and "train: for a stop" in said(proc), 60)


@pytest.mark.slow
def test_a_trainer_resumes_from_the_held_writers_ram_and_a_second_stop_waits_for_that_writer(
        tmp_path, tmp_path_factory):
    run_dir, ckpt = tmp_path / "run", tmp_path / "run" / "checkpoints"
    environ = env(tmp_path_factory)
    hold = Hold(tmp_path / "hold")
    proc = start(run_dir, {**environ, durable.HOLD_ENV: str(hold.path)}, "--save-every", "0")
    resumed = None
    try:
        assert after_start(run_dir, lambda: sum(e["event"] == "step" for e in events(run_dir)) >= 5, 60)
        assert ready_for_a_stop(proc), said(proc)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, said(proc)
        assert hold.reached(60)  # its writer, mid-write
        stopped = [e for e in events(run_dir) if e["event"] == "step"][-1]["step"]
        writer = next(e["writer"] for e in events(run_dir) if e["event"] == "staged")

        before = len(events(run_dir))
        resumed = start(run_dir, environ, "--save-every", "0", "--resume")
        assert after_start(run_dir, lambda: sum(e["event"] == "step" for e in events(run_dir)[before:]) >= 10,
                           60, before)
        new = events(run_dir)[before:]
        assert new[0]["event"] == "start" and new[0]["resume_source"] == "ram", new[0]
        assert new[0]["config"]["resumed_from_step"] == stopped and "resume_wait" not in new[0]["startup_s"]
        assert new[1]["event"] == "step" and new[1]["step"] == stopped + 1
        assert f"step {stopped}'s state in its checkpoint writer's RAM (pid {writer}) read" in said(resumed)
        assert checkpoint.latest(ckpt) is None  # the writer is still held: nothing durable

        # Stopped again: its save waits for the old writer, whose staging it would sweep.
        resumed.send_signal(signal.SIGTERM)
        what = f"waiting up to 120 s for step {stopped}'s checkpoint (writer pid {writer}) to be durable"
        assert wait_for(lambda: what in said(resumed), 60), said(resumed)
        assert resumed.poll() is None and checkpoint.latest(ckpt) is None
        hold.release()
        assert resumed.wait(timeout=60) == 0, said(resumed)
    finally:
        hold.release()
        for trainer in (proc, resumed):
            if trainer is not None and trainer.poll() is None:
                trainer.kill()
    last = [e for e in events(run_dir) if e["event"] == "step"][-1]["step"]
    assert wait_for(lambda: sum(e["event"] == "checkpoint" for e in events(run_dir)) == 2, 60), events(run_dir)[-5:]
    assert [p.name for _, p in durable.step_dirs(ckpt)] == [f"step-{stopped}", f"step-{last}"]
    for _, path in durable.step_dirs(ckpt):
        assert checkpoint.load(path)[1]["step"] == int(path.name.removeprefix("step-"))

    # The run resumed from RAM is on the curve of one never stopped.
    reference = tmp_path / "reference"
    proc = start(reference, environ, "--save-every", "0")
    assert after_start(reference, lambda: any(e.get("step", 0) >= last for e in events(reference)), HANG_S)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    expected = {e["step"]: e["loss"] for e in events(reference) if e["event"] == "step"}
    after = [e for e in events(run_dir)[before:] if e["event"] == "step"]
    assert len(after) >= 10
    for e in after:
        assert e["loss"] == pytest.approx(expected[e["step"]], rel=1e-6), e["step"]


def test_a_resume_falls_back_to_the_disk_from_a_marker_it_does_not_take(held):
    root, pid, hold, weights, state = held
    real = json.loads((root / WRITING_MARKER).read_text())
    told = []
    assert _from_ram(root, told.append)[0][1]["step"] == STEP and not told  # the real one is taken
    skeleton = json.loads(real["texts"][checkpoint.STATE_JSON])
    rewrite(root, {**real, "texts": {**real["texts"], checkpoint.STATE_JSON: json.dumps({**skeleton, "step": 3})}})
    assert _from_ram(root, told.append) is None
    rewrite(root, {**real, "pid": os.getpid()})
    assert _from_ram(root, told.append) is None
    rewrite(root, {**real, "texts": {**real["texts"], checkpoint.STATE_JSON: "{"}})
    assert _from_ram(root, told.append) is None
    assert [said.split(" is not")[0].split(" (")[0] for said in told] == [
        f"step {STEP}'s state in its checkpoint writer's RAM", "the checkpoint writer's RAM",
        f"step {STEP}'s state in its checkpoint writer's RAM"]
    assert "another step's" in told[0] and "not a checkpoint writer" in told[1]
