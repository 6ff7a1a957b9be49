"""Making a written checkpoint durable: publishing it atomically, and doing that in a
writer process of its own so a stopping trainer can exit, and free its GPU, first.

A checkpoint is written in two halves. Staging writes the step's files, unsynced, into a
directory no reader looks at: the run's `checkpoints/.tmp-step-<N>`, or, on the stop path,
`/dev/shm` where it has room (RAM: staging into the page cache of the run's disk measured
as fast at best and several times slower at worst on a busy disk). Publishing makes them
the checkpoint: copied in (from /dev/shm), fsynced, renamed to `step-<N>`, `latest`
repointed, the oldest pruned. Every `step-*` directory is complete; `.tmp-*` is debris of
a killed writer, swept by the next save.

On SIGTERM the trainer stages, then hands publishing to `python -m training.durable`: a
new process (never a fork of the CUDA one) in a session of its own, ignoring SIGHUP,
SIGTERM and SIGINT, named WRITER_NAME (training/contract.py) so a kill that waits for the
run's processes leaves it to finish. It holds an exclusive lock on `checkpoints/.writing`
(JSON: its pid, the step) from before the trainer may exit until the checkpoint is
durable and its `checkpoint` event written, when it removes the file. The lock dies with
the writer, however it dies: `--resume` waits while the marker is locked, and a marker
left unlocked means the write was lost (the previous checkpoint is still the latest).
Where the trainer handed it RAM images, the marker also offers them to a resuming trainer,
which then reads them instead of waiting (training/ram_stage.py); the writer holds them
open until it exits, after the marker is gone.

This module imports nothing but the standard library and the contract's event writer:
the writer starts in tens of milliseconds, without torch.
"""
from __future__ import annotations

import ctypes
import fcntl
import hashlib
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from training import ram_stage
from training.contract import CHECKPOINT, EXIT_FAILURE, EXIT_OK, WRITER_NAME, WRITING_MARKER

KEEP = 2
STEP_DIR = re.compile(r"^step-(\d+)$")
TMP_PREFIX = ".tmp-"
SHM = Path("/dev/shm")
SHM_SPARE = 1.25  # staging in /dev/shm only with this much more room than the state needs
WAIT_S = 120.0  # how long --resume waits for a writer
READY_S = 10.0  # how long a trainer waits for its writer to hold the marker
# Test-only: a FIFO's path; a writer holds after its first image is copied out until the
# FIFO's other end is opened and closed (tests/training/test_ram_stage.py).
HOLD_ENV = "TRACKSIDE_TEST_WRITER_HOLD"


class WriterBusy(Exception):
    """A checkpoint writer is still writing after the wait."""


def step_dirs(root: Path) -> list[tuple[int, Path]]:
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := STEP_DIR.match(p.name))]
    return sorted(found)


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _shm_staging(root: Path) -> str:
    """The /dev/shm name prefix of one checkpoints directory's staging."""
    return "trackside-" + hashlib.sha1(str(root.resolve()).encode()).hexdigest()[:16] + "-"


def sweep(root: Path) -> None:
    """Remove what killed writers and stagers left for `root`. Only with no writer alive
    for it: the trainer sweeps once it has waited for any writer (stage_dir)."""
    root.mkdir(parents=True, exist_ok=True)
    debris = list(root.glob(TMP_PREFIX + "*"))
    if SHM.is_dir():
        debris += SHM.glob(_shm_staging(root) + "*")
    for stale in debris:
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
        else:
            stale.unlink(missing_ok=True)


def stage_dir(root: Path, step: int, ram_bytes: int | None = None) -> Path:
    """A fresh directory to write step `step`'s files into: in /dev/shm when `ram_bytes`
    is given and it has room for them, else the run's own `.tmp-step-<N>`. A writer still
    writing into `root` is waited for first, as the sweep would take its staging: the
    previous run's, whose RAM this one resumed from (training/ram_stage.py)."""
    wait_for_writer(root, lambda said: print(f"train: {said}", flush=True))
    sweep(root)
    staged = root / f"{TMP_PREFIX}step-{step}"
    if ram_bytes is not None and SHM.is_dir():
        room = os.statvfs(SHM)
        if room.f_bavail * room.f_frsize > ram_bytes * SHM_SPARE:
            staged = SHM / f"{_shm_staging(root)}step-{step}"
    staged.mkdir()
    return staged


def publish(staged: Path, root: Path, step: int, images: dict[str, int] | None = None,
            copied=lambda: None) -> Path:
    """Make the staged files checkpoint step-<step>: fsynced, renamed in, `latest`
    repointed, pruned to the newest KEEP. `images`: more of its files, each an open file
    (a name → its descriptor: training/mirror.py's images in RAM), closed here; `copied()`
    after each. The staging is gone after."""
    final = root / f"step-{step}"
    tmp = root / f"{TMP_PREFIX}step-{step}"
    if staged != tmp:
        shutil.copytree(staged, tmp)
        shutil.rmtree(staged)
    for name, fd in (images or {}).items():
        _copy_out(fd, tmp / name)
        copied()
    for f in tmp.iterdir():
        _fsync_path(f)
    _fsync_path(tmp)
    if final.exists():  # a resumed run saving the same step again
        _discard(final)
    os.rename(tmp, final)
    _fsync_path(root)

    pointer_tmp = root / f"{TMP_PREFIX}latest"
    pointer_tmp.write_text(final.name + "\n")
    _fsync_path(pointer_tmp)
    os.replace(pointer_tmp, root / "latest")
    _fsync_path(root)

    for _, old in step_dirs(root)[:-KEEP]:
        _discard(old)
    return final


def _copy_out(fd: int, path: Path) -> None:
    """The whole of open file `fd` into a new file at `path`, in the kernel (sendfile),
    then `fd` closed."""
    try:
        size = os.fstat(fd).st_size
        with open(path, "wb") as out:
            offset = 0
            while offset < size:
                sent = os.sendfile(out.fileno(), fd, offset, size - offset)
                if sent == 0:
                    raise OSError(f"{path.name}: its image ended at {offset} of {size} bytes")
                offset += sent
    finally:
        os.close(fd)


def _discard(step_dir: Path) -> None:
    # Renamed away first, so a kill during the deletion leaves no half step directory.
    doomed = step_dir.with_name(f"{TMP_PREFIX}old-{step_dir.name}")
    os.rename(step_dir, doomed)
    shutil.rmtree(doomed)


def hand_off(staged: Path, root: Path, step: int, metrics: Path | None,
             images: dict[str, int] | None = None) -> int | None:
    """Start the writer that publishes `staged` (and `images`, open files it inherits)
    and writes the checkpoint event to `metrics`; its pid once its marker is locked, or
    None if it did not get that far (the caller then publishes itself)."""
    images = images or {}
    package = str(Path(__file__).resolve().parents[1])  # wherever this trainer's code is
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (package, os.environ.get("PYTHONPATH")) if p)}
    writer = subprocess.Popen(
        [sys.executable, "-m", ram_stage.WRITER_MODULE, str(staged), os.path.abspath(root), str(step),
         str(metrics or ""), *(f"{name}={fd}" for name, fd in images.items())],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, start_new_session=True, env=env,
        bufsize=0, pass_fds=tuple(images.values()))
    # A writer that is not ready soon is killed and the caller publishes: a trainer never
    # waits on it for long, nor leaves two publishing one step.
    said, deadline = b"", time.monotonic() + READY_S
    while b"\n" not in said and (left := deadline - time.monotonic()) > 0:
        if not select.select([writer.stdout], [], [], left)[0]:
            break
        chunk = os.read(writer.stdout.fileno(), 64)
        if not chunk:
            break
        said += chunk
    writer.stdout.close()
    if said == b"ready\n":
        return writer.pid
    writer.kill()
    writer.wait()
    return None


def wait_for_writer(root: Path, say, timeout_s: float = WAIT_S) -> None:
    """Return once no checkpoint writer is writing into `root`, saying so through `say`
    if it waits; WriterBusy after `timeout_s`. A marker its writer left behind (killed
    before the checkpoint was durable) is said and removed: what is complete is kept."""
    try:
        fd = os.open(root / WRITING_MARKER, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        try:  # a marker offering a RAM stage carries its texts: more than a page
            info = json.loads(os.read(fd, ram_stage.MARKER_MAX) or b"{}")
        except ValueError:
            info = {}
        info = info if isinstance(info, dict) else {}
        what = f"step {info.get('step')}'s checkpoint (writer pid {info.get('pid')})"
        if _locked(fd):
            say(f"waiting up to {timeout_s:.0f} s for {what} to be durable")
            deadline = time.monotonic() + timeout_s
            while _locked(fd):
                if time.monotonic() > deadline:
                    raise WriterBusy(f"{what} is still being written after {timeout_s:.0f} s: "
                                     "try again once it is done")
                time.sleep(0.05)
        if os.fstat(fd).st_nlink == 0 or (root / f"step-{info.get('step')}").is_dir():
            say(f"{what} is durable")
            return
        say(f"{what} was lost (the writer ended before it was durable): "
            "the newest complete checkpoint is the latest")
        (root / WRITING_MARKER).unlink(missing_ok=True)
    finally:
        os.close(fd)


def _locked(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False


def _hold_marker(root: Path, step: int, offered: dict) -> int:
    """Create the marker already locked (locked under a temporary name, then renamed in:
    a waiter never sees it unlocked while its writer lives), with `offered` (a RAM stage's
    fields) in it; the fd that holds the lock."""
    tmp = root / f"{TMP_PREFIX}writing-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    text = json.dumps({"pid": os.getpid(), "step": step, **offered}).encode()
    while text:
        text = text[os.write(fd, text):]
    os.fsync(fd)
    os.rename(tmp, root / WRITING_MARKER)
    return fd


def _name_process(name: str) -> None:
    """The name `ps -o comm=` shows (Linux's prctl PR_SET_NAME; elsewhere nothing)."""
    try:
        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)
    except (AttributeError, OSError):
        pass


def _holding(fifo: str | None):
    """publish's `copied`: nothing, or (test-only, HOLD_ENV) the first time a wait until the
    test has opened `fifo` and closed it again."""
    waits = [fifo] if fifo else []

    def copied() -> None:
        while waits:
            with open(waits.pop(), "rb") as held:
                held.read()
    return copied


def main(argv: list[str]) -> int:
    """The writer: publish a staged checkpoint, whatever happens to the trainer's pane."""
    staged, root, step, metrics = Path(argv[0]), Path(argv[1]), int(argv[2]), argv[3]
    images = {name: int(fd) for name, fd in (image.split("=") for image in argv[4:])}
    for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    _name_process(WRITER_NAME)
    # Its lock lives as long as this process; so do `images`, at the numbers the marker
    # offers them by (publish closes copies of them).
    _hold_marker(root, step, ram_stage.offer(staged, images))
    print("ready", flush=True)
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the trainer stops reading
    started = time.perf_counter()
    try:
        path = publish(staged, root, step, {name: os.dup(fd) for name, fd in images.items()},
                       copied=_holding(os.environ.get(HOLD_ENV)))
    except OSError as error:
        if staged.parent != root:
            shutil.rmtree(staged, ignore_errors=True)  # not to hold RAM in /dev/shm
        try:
            print(f"checkpoint writer: step {step} not written: {error}", file=sys.stderr, flush=True)
        except OSError:  # the trainer's pane is gone
            pass
        return EXIT_FAILURE
    if metrics:
        from training.metrics import MetricsWriter

        writer = MetricsWriter(Path(metrics))
        writer.write(CHECKPOINT, step=step, path=str(path),
                     write_s=round(time.perf_counter() - started, 3))
        writer.close()
    (root / WRITING_MARKER).unlink()
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
