"""The run directory on its host: where it is, its manifest, its recorded exit status and
its checkpoints.

`<runs_root>/<run_id>/` holds `manifest.json` (what was launched, where, and how it ended),
`console.log` (the pane's output via pipe-pane), `exit_status` (written when the command
ends) and, for the trainer, `metrics.jsonl` and `checkpoints/`. Files on the host are
written and read by commands with fixed scripts and the paths as arguments, so no path or
value is ever spliced into shell text. Every such command checks the runs root first
(backends/runsroot.py): a root, or a directory or file in it, that another user could change
is refused, never written or read through.
"""

from __future__ import annotations

import calendar
import json
import posixpath
import time

from backends import runsroot
from backends.hosts import Host, HostError
from backends.runs.manifest import TIME, ManifestError, parse_manifest
from training.contract import RUN_ID, RUN_ID_EXAMPLE, WRITING_MARKER

# Write stdin to file "$3" of directory "$2" under runs root "$1", atomically: into a new
# file beside it (mktemp's, this user's alone), renamed over it, never written through a
# link; what a full disk left half-written is removed.
_WRITE_FILE = r"""[ -d "$1" ] || mkdir -p -- "$1" || exit 1
root_ok "$1"; dirs_ok "$1" "$2"; f=$1/$2/$3
files_ok "$f"
t=$(mktemp "$1/$2/.$3.XXXXXX") || exit 1
cat > "$t" && mv -fT -- "$t" "$f" || { rm -f -- "$t"; exit 1; }
"""

# A new run's directory "$2" under runs root "$1" (made, 0700, where absent): never one
# that is there already.
_MAKE_RUN_DIR = r"""[ -d "$1" ] || mkdir -p -- "$1" || exit 1
root_ok "$1"
mkdir -- "$1/$2" || exit 1
files_ok "$1/$2"
"""

# Whether the checkpoints dir "$1" holds a checkpoint, or one on its way (its writer's
# marker "$2"): prints something if so.
_CHECKPOINT_THERE = r"""ls -A "$1" 2>/dev/null | grep -E -x -e 'step-[0-9]+' -e "$2" | head -n 1"""

# Print "$1", or exit 3 when there is no such file: a missing file is told apart from one
# that cannot be read without reading cat's words.
_READ_FILE = 'above_ok "${1%/*}"; files_ok "$1"; [ -e "$1" ] || exit 3; exec cat -- "$1"'
NO_FILE = 3

EXIT_STATUS_FILE = "exit_status"


class RunError(Exception):
    """A run could not be found, started or read."""


STAMP = "%Y-%m-%dT%H:%M:%SZ"  # a manifest's times (UTC), as the trainer and the launcher write them


def now() -> str:
    return time.strftime(STAMP, time.gmtime())


def epoch(stamp) -> float | None:
    """A manifest's time in seconds since the epoch; None for anything else (strptime alone
    takes `2026-1-2T3:4:5Z` too)."""
    return float(calendar.timegm(time.strptime(stamp, STAMP))) if isinstance(stamp, str) and TIME.fullmatch(stamp) else None


def check_run_id(run_id: str) -> str:
    if not RUN_ID.fullmatch(run_id):
        raise RunError(f"{run_id!r} is not a run id (like {RUN_ID_EXAMPLE})")
    return run_id


async def runs_root(host: Host) -> str:
    """The host's runs root, expanded; RunsRootRefused, naming it, where another user could
    change it (backends/runsroot.py)."""
    root = await host.expanded_runs_root()
    await runsroot.check(host, root)
    return root


async def run_dir(host: Host, run_id: str) -> str:
    return f"{await runs_root(host)}/{check_run_id(run_id)}"


async def write_file(host: Host, path: str, text: str) -> None:
    """`path`, a file under the runs root, holding `text`: replaced whole, its directories
    made; RunsRootRefused for a path elsewhere (a manifest's claim) or one another user
    could change."""
    root = await host.expanded_runs_root()
    if not path.startswith(f"{root}/"):
        raise runsroot.RunsRootRefused(host.name, f"refused: {path} is not under the runs root {root}")
    where, name = posixpath.split(path.removeprefix(f"{root}/"))
    result = await runsroot.run(host, _WRITE_FILE, [root, where, name], input=text)
    if not result.ok:
        raise HostError(host.name, f"cannot write {path}: {result.stderr.strip()}")


async def make_run_dir(host: Host, directory: str) -> None:
    """A new run's directory, `<runs root>/<run id>`: RunError where it is there already."""
    root, run_id = posixpath.split(directory)
    result = await runsroot.run(host, _MAKE_RUN_DIR, [root, check_run_id(run_id)])
    if not result.ok:
        raise RunError(f"cannot make the run directory {directory} on {host.name}: {result.stderr.strip()}")


async def read_file(host: Host, path: str, timeout: float = 30.0) -> str | None:
    """A file's text; None when there is no such file; RunError, one line naming the file
    and why, when it cannot be read."""
    result = await runsroot.run(host, _READ_FILE, [path], timeout=timeout)
    if result.returncode == NO_FILE:
        return None
    if not result.ok:
        why = result.stderr.strip().splitlines()[-1:] or [f"exit status {result.returncode}"]
        raise RunError(f"cannot read {path} on {host.name}: {why[0].rsplit(': ', 1)[-1]}")  # cat's "cat: PATH: why"
    return result.stdout


async def read_manifest(host: Host, run_id: str) -> dict:
    path = f"{await run_dir(host, run_id)}/manifest.json"
    text = await read_file(host, path)
    if text is None:
        raise RunError(f"no run {run_id} on {host.name} (no {path})")
    try:
        return parse_manifest(text, run_id)
    except ManifestError as e:
        raise RunError(f"{path} is unreadable: {e}") from None


async def write_manifest(host: Host, manifest: dict) -> None:
    """The manifest, in its run's directory under the runs root (`<root>/<run id>`, where a
    listing found it), whatever its `run_dir` says (a run typed by hand records its --out
    as typed)."""
    root = await host.expanded_runs_root()
    await write_file(host, f"{root}/{check_run_id(manifest['run_id'])}/manifest.json", json.dumps(manifest) + "\n")


async def record_end(host: Host, manifest: dict, exit_status: int | None) -> dict:
    """Fill the manifest's end once; later calls leave the first record in place. The
    status is recorded the shell's way, as in the `exit_status` file beside it."""
    if manifest.get("ended") is None:
        manifest = {**manifest, "ended": now(), "exit_status": shell_exit_status(exit_status)}
        await write_manifest(host, manifest)
    return manifest


async def checkpoints_to_resume(host: Host, run_dir: str) -> str | None:
    """The run's checkpoints dir if it holds a checkpoint, or one its writer is still making
    durable (a run stopped a moment ago: the trainer resuming from it waits for the writer)."""
    checkpoints = f"{run_dir}/checkpoints"
    result = await host.run(["sh", "-c", _CHECKPOINT_THERE, "sh", checkpoints, WRITING_MARKER])
    return checkpoints if result.stdout.strip() else None


def parse_exit_status(text: str) -> int | None:
    """A recorded shell status: the code, or minus the signal (sh reports 128 + N)."""
    text = text.strip()
    if not text.isdigit():
        return None
    code = int(text)
    return -(code - 128) if 128 < code < 128 + 65 else code


def shell_exit_status(code: int | None) -> int | None:
    """A status as the shell records it: minus signal N is 128 + N."""
    return 128 - code if code is not None and code < 0 else code


def manifest_exit_status(manifest: dict) -> int | None:
    """The manifest's recorded status, as in memory (one written before it was recorded
    the shell's way holds minus the signal already)."""
    status = manifest.get("exit_status")
    return status if not isinstance(status, int) or status < 0 else parse_exit_status(str(status))


async def read_exit_status(host: Host, directory: str) -> int | None:
    try:
        text = await read_file(host, f"{directory}/{EXIT_STATUS_FILE}")
    except RunError:
        return None
    return parse_exit_status(text) if text is not None else None
