"""Compiled kernels kept for the next launch, so a box whose caches are cold does not
compile the islands again.

Inductor's on-disk cache lives under /tmp and on one machine: a fresh box (or one
rebooted) compiles every island from scratch on its first step. After a run's first step
the trainer keeps what this process compiled or found cached (torch's portable cache
artifacts: inductor's graphs, their Triton kernels, AOTAutograd's wrappers) as one set,
a file under the runs root in a folder named for what it was compiled for (torch, Triton,
CUDA, the card's architecture); each later launch loads the newest sets there into
inductor's cache before anything compiles. Sets of other drafters and models sit beside
each other: a launch writes a set only where what it used is not all among those it
loaded. The package's own `compiled/` folder is read the same way: sets kept there travel
with the code when it is shipped to a host (backends/ship), so a box's first launch
finds them.

The artifacts are pickles and generated code, so loading one runs what it holds: a set in
the runs root is loaded only where it and its folders belong to this user (or root),
nobody else can write to them, and none is a link. The package's own sets are trusted as
the code beside them is (whoever can write them can write that code; a checkout made under
umask 002 leaves both group-writable), links still refused. A set that fails to load is
skipped: the islands compile as if it were not there.
"""
from __future__ import annotations

import hashlib
import lzma
import os
import re
import stat
from pathlib import Path

import torch

from training.compiled import after_compiler_imports

FOLDER = "compiled"  # under the runs root, and in the package
PACKAGE_FOLDER = Path(__file__).resolve().parent / FOLDER
NEWEST = 8  # sets loaded from each folder, the newest first; older ones are removed by `keep`
# A set is xz-compressed: mostly generated source and PTX, it shrinks ~15× at preset 1, in
# a third of a second, so the package can carry sets within the shipping cap.
SUFFIX = ".xz"
LEGACY_SUFFIX = ".bin"  # the sets' suffix before they were compressed; `keep` removes them

_keep_in: Path | None = None  # the runs root's folder for this target, set by `load`
_loaded: frozenset = frozenset()  # every artifact `load` read, so a set already there is not written again


def target(device: torch.device) -> str:
    """What kernels were compiled for: the folder's name. One architecture's serve every
    card of it (an H100's, an H200's)."""
    if device.type == "cuda":
        import triton

        major, minor = torch.cuda.get_device_capability(device)
        name = f"triton-{triton.__version__}-cuda-{torch.version.cuda}-sm{major}{minor}"
    else:
        name = device.type
    return re.sub(r"[^A-Za-z0-9._+-]", "_", f"torch-{torch.__version__}-{name}")


def _owned(st: os.stat_result) -> bool:
    """This user's or root's (as the Python it runs is), and nobody else can write it."""
    return st.st_uid in (os.geteuid(), 0) and not st.st_mode & 0o022


def _as_code(st: os.stat_result) -> bool:
    return True


def _open_folder(path: Path, ok=_owned) -> int | None:
    """An fd of `path`, reached without following a link at its last two parts, where both
    are folders that pass `ok`; else None."""
    fds = []
    try:
        for part in (path.parent, path.name):
            fds.append(os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                               dir_fd=fds[-1] if fds else None))
            if not ok(os.fstat(fds[-1])):
                return None
        return fds.pop()
    except OSError:
        return None
    finally:
        for fd in fds:
            os.close(fd)


def _sets(dirfd: int, ok=_owned) -> list[tuple[float, str, bytes | None]]:
    """(modified, name, bytes) of each set in the folder, newest first; bytes None for one
    that is a link, not a file, or fails `ok`."""
    found = []
    for name in os.listdir(dirfd):
        if not name.endswith(SUFFIX) or name.startswith("."):
            continue
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dirfd)
        except OSError:
            found.append((0.0, name, None))
            continue
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            found.append((st.st_mtime, name, f.read() if stat.S_ISREG(st.st_mode) and ok(st) else None))
    return sorted(found, key=lambda s: s[:2], reverse=True)


def _names(info) -> frozenset:
    return frozenset((kind, key) for kind, keys in info.artifacts.items() for key in keys) if info else frozenset()


def load(runs_root: Path, device: torch.device, places: tuple[Path, ...] = (PACKAGE_FOLDER,)) -> list[str]:
    """Load the newest kept sets for `device` from the package's folder and the runs
    root's into inductor's cache; `keep` writes to the runs root's. A line for each
    folder that held any, saying what was loaded or refused."""
    global _keep_in, _loaded
    name = target(device)
    _keep_in = runs_root / FOLDER / name
    said = []
    for folder, ok in (*((place / name, _as_code) for place in places), (_keep_in, _owned)):
        if not os.path.lexists(folder):
            continue
        dirfd = _open_folder(folder, ok)
        if dirfd is None:
            said.append(f"{folder}: nothing loaded: it or its folder is a link, or another user could write it")
            continue
        try:
            sets = _sets(dirfd, ok)
        finally:
            os.close(dirfd)
        loaded, refused, failed = 0, [], []
        for _, set_name, data in sets[:NEWEST]:
            if data is None:
                refused.append(set_name)
                continue
            try:
                info = torch.compiler.load_cache_artifacts(lzma.decompress(data))
            except Exception as exc:  # a torn file's LZMAError; torch's errors for a stale set vary
                failed.append(f"{set_name} ({type(exc).__name__})")
                continue
            if info is None:  # torch logs what it could not unpickle and goes on
                failed.append(f"{set_name} (not torch's artifacts)")
                continue
            _loaded |= _names(info)
            loaded += len(_names(info))
        line = f"{folder}: {loaded} compiled artifacts loaded"
        if refused:
            line += f"; not loaded, a link or another user could write it: {', '.join(refused)}"
        if failed:
            line += f"; failed to load: {', '.join(failed)}"
        said.append(line)
    return said


def load_meanwhile(runs_root: Path) -> None:
    """`load` for this process's card on a thread after the compiler's imports, joined
    before the first compile (training/compiled.py); rank 0 says what was loaded."""
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))

    def work() -> None:
        for line in load(runs_root, device):
            if os.environ.get("RANK", "0") == "0":
                print(f"train: {line}", flush=True)
    after_compiler_imports(work, "compiled-kept")


def keep() -> str | None:
    """Write what this process compiled or found cached, as one set in the runs root's
    folder for the next launch (written whole, then renamed into place), and remove the
    sets past the newest NEWEST and any left in the format before; a line saying so, or
    None where nothing is new (or `load` was not called)."""
    global _loaded
    if _keep_in is None:
        return None
    saved = torch.compiler.save_cache_artifacts()
    if saved is None or _names(saved[1]) <= _loaded:
        return None
    data, info = saved
    try:
        _keep_in.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        return f"{_keep_in}: compiled artifacts not kept ({exc})"
    dirfd = _open_folder(_keep_in)
    if dirfd is None:
        return f"{_keep_in}: compiled artifacts not kept: it or its folder is a link, or another user could write it"
    name = hashlib.sha256(repr(sorted(_names(info))).encode()).hexdigest()[:16] + SUFFIX
    data = lzma.compress(data, preset=1)
    temporary = f".{name}.{os.getpid()}"
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600, dir_fd=dirfd)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(temporary, name, src_dir_fd=dirfd, dst_dir_fd=dirfd)
        for _, old, _ in _sets(dirfd)[NEWEST:]:
            os.unlink(old, dir_fd=dirfd)
        for old in os.listdir(dirfd):  # sets in the format before xz: never loaded now
            if old.endswith(LEGACY_SUFFIX) and not old.startswith("."):
                os.unlink(old, dir_fd=dirfd)
    except OSError as exc:
        try:
            os.unlink(temporary, dir_fd=dirfd)
        except OSError:
            pass
        return f"{_keep_in}: compiled artifacts not kept ({exc})"
    finally:
        os.close(dirfd)
    _loaded |= _names(info)
    return f"{_keep_in / name}: {len(data) / 2**20:.1f} MiB of compiled artifacts kept for the next launch"
