"""A stopped run's state read from its checkpoint writer's RAM while the writer makes it
durable, so a resume need not wait for the disk.

A stopping trainer's tensor files are complete safetensors images in memfds
(training/mirror.py) before its writer (training/durable.py) starts. The writer inherits
them, keeps every one open for as long as it lives, and its marker (`checkpoints/.writing`,
renamed in once it holds them) offers them (`offer`): per image its descriptor's number in
the writer, device, inode and size, and the text of the checkpoint's small staged files.
A resuming trainer (`take`) opens each image through /proc/<writer>/fd/<n>: from then on
the image is its own, whatever becomes of the writer (a memfd lives while anyone holds it,
and nothing writes into it after the trainer's stop). The writer removes its marker only
once the checkpoint is durable, and closes the images only by exiting after that: a reader
that comes later finds no marker, or a writer gone, and reads the durable files.

The run dir is in a runs root others may write, so the marker is hostile until checked: read
without following a symlink, bounded; its pid that of a live process of this user named as
the writer, running `-m training.durable` for this very checkpoints directory, step and
descriptors; each descriptor opened a memfd of the mirror's name, with the inode and size
the marker says. Anything else and the offer is not taken (NotOffered says why): the
resume then waits for the writer and reads the durable checkpoint.

Standard library only: the writer imports this without torch.
"""
from __future__ import annotations

import json
import os
import select
import stat
from dataclasses import dataclass
from pathlib import Path

from training.contract import WRITER_NAME, WRITING_MARKER

MEMFD_PREFIX = "trackside-"  # a mirror image's memfd is named this and its file's name
TEXTS_MAX = 4 * 2**20  # the staged small files a marker carries, in all (a state.json is KiB)
MARKER_MAX = 8 * TEXTS_MAX  # JSON's escapes of those texts, and the rest
IMAGE_MAX = 2**42  # 4 TiB: no image is larger (a size past it is a forged one)
WRITER_MODULE = "training.durable"


class NotOffered(Exception):
    """No RAM stage to take: the reason, or empty where none was offered at all (no marker,
    or the marker of a writer with no images)."""


def offer(staged: Path, images: dict[str, int]) -> dict:
    """The marker's fields that offer `images` (file name → descriptor, held by the calling
    writer until it exits) and the other files of `staged`; none without images, or where
    those files hold more than TEXTS_MAX."""
    if not images:
        return {}
    texts, total = {}, 0
    try:
        for f in sorted(staged.iterdir()):
            total += f.stat().st_size
            if total > TEXTS_MAX or not f.is_file():
                return {}
            texts[f.name] = f.read_text()
    except (OSError, ValueError):  # the writer publishes all the same, from the disk's side
        return {}
    described = {}
    for name, fd in images.items():
        st = os.fstat(fd)
        described[name] = {"fd": fd, "dev": st.st_dev, "ino": st.st_ino, "size": st.st_size}
    return {"images": described, "texts": texts}


@dataclass
class Stage:
    """A writer's images, opened by this process (its own descriptors), and its texts."""

    step: int
    pid: int
    fds: dict[str, int]
    texts: dict[str, str]

    def path(self, name: str) -> str:
        """Where this process reads image `name` (its own descriptor's)."""
        return f"/proc/self/fd/{self.fds[name]}"

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds = {}

    def __enter__(self) -> "Stage":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _is_int(value, low: int, high: int) -> bool:
    return type(value) is int and low <= value <= high


def _marker(root: Path) -> dict:
    try:
        fd = os.open(root / WRITING_MARKER, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise NotOffered("") from None
    except OSError as error:  # ELOOP: a symlink
        raise NotOffered(f"its marker cannot be read as a file ({error.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MARKER_MAX:
            raise NotOffered("its marker is not a file of a marker's size")
        text = os.read(fd, MARKER_MAX + 1)
    finally:
        os.close(fd)
    try:
        marker = json.loads(text)
    except ValueError:
        raise NotOffered("its marker is not JSON (being written, or not a marker)") from None
    if not isinstance(marker, dict):
        raise NotOffered("its marker is not a table")
    return marker


def _checked_fields(marker: dict, images: set[str], texts: set[str]) -> tuple[int, int, dict, dict]:
    if "images" not in marker:
        raise NotOffered("")  # a writer of a stop that took the ordinary way, or an older one
    pid, step, offered, said = (marker.get(k) for k in ("pid", "step", "images", "texts"))
    if not _is_int(pid, 2, 2**22) or not _is_int(step, 0, 2**62):
        raise NotOffered("its marker's pid or step is not a number of theirs")
    if not isinstance(offered, dict) or set(offered) != images:
        raise NotOffered(f"its marker offers other images than {sorted(images)}")
    if not isinstance(said, dict) or set(said) != texts or not all(isinstance(t, str) for t in said.values()):
        raise NotOffered(f"its marker holds other files than {sorted(texts)}")
    for name, image in offered.items():
        if not (isinstance(image, dict) and _is_int(image.get("fd"), 3, 2**20)
                and _is_int(image.get("size"), 1, IMAGE_MAX)
                and all(_is_int(image.get(k), 0, 2**64) for k in ("dev", "ino"))):
            raise NotOffered(f"its marker's {name} is not a descriptor, device, inode and size")
    return pid, step, offered, said


def _check_writer(pid: int, root: Path, step: int, offered: dict) -> None:
    """That `pid` is a checkpoint writer of this user for `root`, step `step`, handed the
    offered descriptors (its command line says what its trainer started it with)."""
    proc = Path(f"/proc/{pid}")
    try:
        owner = proc.stat().st_uid
        comm = (proc / "comm").read_text().strip()
        argv = (proc / "cmdline").read_bytes().split(b"\0")[:-1]
    except OSError:
        raise NotOffered(f"its writer (pid {pid}) is gone") from None
    if owner != os.getuid() or comm != WRITER_NAME:
        raise NotOffered(f"pid {pid} is not a checkpoint writer of this user")
    try:
        argv = [os.fsdecode(a) for a in argv]
        writes_here = (len(argv) >= 7 and argv[1:3] == ["-m", WRITER_MODULE] and os.path.isabs(argv[4])
                       and os.path.samestat(os.stat(argv[4]), os.stat(root)) and argv[5] == str(step))
    except OSError:
        writes_here = False
    if not writes_here:
        raise NotOffered(f"pid {pid} is not the writer of step {step} into {root}")
    if sorted(argv[7:]) != sorted(f"{name}={image['fd']}" for name, image in offered.items()):
        raise NotOffered(f"pid {pid} was not handed the descriptors its marker names")


def _open_image(pid: int, name: str, image: dict) -> int:
    """Writer `pid`'s image `name`, opened here; NotOffered unless it is the memfd the
    marker describes."""
    try:
        fd = os.open(f"/proc/{pid}/fd/{image['fd']}", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as error:  # closed: the writer is done, or going
        raise NotOffered(f"its writer's (pid {pid}) {name} cannot be opened ({error.strerror})") from None
    try:
        st = os.fstat(fd)
        target = os.readlink(f"/proc/self/fd/{fd}")
        if target != f"/memfd:{MEMFD_PREFIX}{name} (deleted)" or not stat.S_ISREG(st.st_mode):
            raise NotOffered(f"its writer's descriptor {image['fd']} is not {name}'s image")
        if (st.st_dev, st.st_ino, st.st_size) != (image["dev"], image["ino"], image["size"]):
            raise NotOffered(f"{name}'s image is not the one its marker names")
    except BaseException:
        os.close(fd)
        raise
    return fd


def take(root: Path, images: set[str], texts: set[str]) -> Stage:
    """The RAM stage a live writer offers in checkpoints dir `root`: images named `images`
    and texts named `texts`, all of them, opened by this process; NotOffered otherwise."""
    pid, step, offered, said = _checked_fields(_marker(root), images, texts)
    try:
        handle = os.pidfd_open(pid)  # this very process from here on, or none
    except OSError:
        raise NotOffered(f"its writer (pid {pid}) is gone") from None
    fds: dict[str, int] = {}
    try:
        _check_writer(pid, root, step, offered)
        for name, image in offered.items():
            fds[name] = _open_image(pid, name, image)
        # What /proc said was of the process the pidfd holds only if it still lives: dead,
        # its pid could have named another process since.
        if select.select([handle], [], [], 0)[0]:
            raise NotOffered(f"its writer (pid {pid}) ended while its images were opened")
    except BaseException:
        for fd in fds.values():
            os.close(fd)
        raise
    finally:
        os.close(handle)
    return Stage(step, pid, fds, said)
