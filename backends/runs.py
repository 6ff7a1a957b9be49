"""Runs: commands started in tmux with a run directory, and every other tmux session.

A run directory `<runs_root>/<run_id>/` holds `manifest.json` (what was launched, where,
and how it ended), `console.log` (the pane's output via pipe-pane), `exit_status` (written
when the command ends) and, for the trainer, `metrics.jsonl` and `checkpoints/`. Files on the host are written and read by commands
with fixed scripts and the paths as arguments, so no path or value is ever spliced into
shell text.
"""

from __future__ import annotations

import asyncio
import enum
import json
import os
import posixpath
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from backends import console, tmux
from backends import params as run_params
from backends.hosts import Host, HostError
from backends.logparse import Progress
from backends.own_session import own_sessions
from training.contract import EXIT_OOM, RUN_ID, RUN_ID_EXAMPLE, new_run_id

TRAIN_COMMAND = ["trackside", "train"]
METRICS_TAIL_LINES = 64
STARTUP_S = 2.0  # a pane that dies this soon after its launch, but for a clean exit, failed to start
STARTUP_POLL_S = 0.1
FAILED_START_LINES = 15  # of the pane, quoted in a failed launch's error
DRAIN_READS = 10  # of a dead pane still showing none of its output, STARTUP_POLL_S apart

# The path the host's PATH gives program "$1" (a shell builtin gives its bare name).
_WHICH = 'command -v "$1"'

# Write stdin to "$1" atomically, creating its directory.
_WRITE_FILE = 'mkdir -p "$(dirname "$1")" && cat > "$1.tmp" && mv -f "$1.tmp" "$1"'

# Hard-link checkpoint "$1" (a step dir) into the checkpoints dir "$2" and point `latest` at it.
_LINK_CHECKPOINT = 'mkdir -p "$2" && cp -al "$1" "$2/" && basename "$1" > "$2/latest"'

# The newest step-<N> directory under the checkpoints dir "$1", as the trainer picks it.
_LATEST_CHECKPOINT = r"""ls "$1" 2>/dev/null | grep -E '^step-[0-9]+$' | sort -t- -k2 -n | tail -n 1"""

# The pane runs the command under this sh, which records its exit status in "$1": tmux
# 3.3 sometimes shows a dead pane without one. The traps are handlers, not ignores, so the
# command still gets the default actions; sh itself waits for it, then writes the file.
_RECORD_EXIT = 'f=$1; shift; trap : HUP INT TERM; "$@"; s=$?; echo "$s" > "$f"; exit "$s"'
EXIT_STATUS_FILE = "exit_status"

# For each run dir under "$1": a record-separator line with the dir, the manifest, a
# file-separator with the recorded exit status, a group-separator line, then the first and
# last lines of metrics.jsonl. JSON lines never contain raw control characters, so the
# separators cannot collide with content.
_READ_RUNS = r"""
for d in "$1"/*/; do
  [ -f "${d}manifest.json" ] || continue
  printf '\036%s\n' "$d"
  cat "${d}manifest.json"; echo
  printf '\034'; cat "${d}exit_status" 2>/dev/null; echo
  printf '\035\n'
  if [ -f "${d}metrics.jsonl" ]; then head -n 1 "${d}metrics.jsonl"; tail -n "$2" "${d}metrics.jsonl"; fi
done
"""


class RunError(Exception):
    """A run could not be found, started or read."""


class RunPhase(enum.Enum):
    """Where a run is in its life, as a listing finds it (the dashboard's view of a whole
    run is tui.state.RunState)."""

    RUNNING = "running"
    EXITED = "exited"
    OOM = "oom"
    UNKNOWN = "unknown"


@dataclass
class RunInfo:
    run_id: str | None  # None: a tmux session trackside did not launch
    session: str
    host: str
    state: RunPhase
    exit_status: int | None = None
    params: dict = field(default_factory=dict)
    last_step: int | None = None
    last_loss: float | None = None
    steps_per_epoch: int | None = None
    pids: list[int] = field(default_factory=list)
    run_dir: str | None = None
    parent: str | None = None
    started: str | None = None
    end_status: str | None = None  # the trainer's own end event: completed, stopped, ...
    this_dashboard: bool = False  # the session this trackside runs in: never to be stopped
    progress: Progress | None = None  # a foreign session's latest bar or N/M counter

    def to_json(self) -> dict:
        return {**asdict(self), "state": self.state.value}


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def check_run_id(run_id: str) -> str:
    if not RUN_ID.fullmatch(run_id):
        raise RunError(f"{run_id!r} is not a run id (like {RUN_ID_EXAMPLE})")
    return run_id


async def runs_root(host: Host) -> str:
    root = host.runs_root
    if root == "~" or root.startswith("~/"):
        root = (await host.home()).rstrip("/") + root[1:]
    return root.rstrip("/")


async def run_dir(host: Host, run_id: str) -> str:
    return f"{await runs_root(host)}/{check_run_id(run_id)}"


async def write_file(host: Host, path: str, text: str) -> None:
    result = await host.run(["sh", "-c", _WRITE_FILE, "sh", path], input=text)
    if not result.ok:
        raise HostError(host.name, f"cannot write {path}: {result.stderr.strip()}")


async def read_manifest(host: Host, run_id: str) -> dict:
    path = f"{await run_dir(host, run_id)}/manifest.json"
    result = await host.run(["cat", path])
    if not result.ok:
        raise RunError(f"no run {run_id} on {host.name} ({path}: {result.stderr.strip()})")
    try:
        return json.loads(result.stdout)
    except ValueError as e:
        raise RunError(f"{path} is not valid JSON: {e}")


async def write_manifest(host: Host, manifest: dict) -> None:
    await write_file(host, f"{manifest['run_dir']}/manifest.json", json.dumps(manifest) + "\n")


async def record_end(host: Host, manifest: dict, exit_status: int | None) -> dict:
    """Fill the manifest's end once; later calls leave the first record in place."""
    if manifest.get("ended") is None:
        manifest = {**manifest, "ended": now(), "exit_status": exit_status}
        await write_manifest(host, manifest)
    return manifest


def train_args_start(argv: Sequence[str], train_command: Sequence[str] | None = None) -> int | None:
    """Index just past the trainer's `train` subcommand, or None if argv is not the trainer.

    Recognised by what it runs: the host's configured train command, `trackside train`
    by any path to `trackside` (`.venv/bin/trackside train`), and `python -m training train`.
    """
    argv = list(argv)
    if train_command and argv[: len(train_command)] == list(train_command):
        return len(train_command)
    if len(argv) >= 2 and posixpath.basename(argv[0]) == TRAIN_COMMAND[0] and argv[1] == TRAIN_COMMAND[1]:
        return 2
    for i in range(len(argv) - 2):
        if argv[i : i + 3] == ["-m", "training", "train"]:
            return i + 3
    return None


def launch_command(argv: Sequence[str], params: dict, out_dir: str, train_command: Sequence[str] | None) -> list[str]:
    """The argv actually run: the host's train command in place of `trackside train`,
    params applied and `--out` pointing at the run dir (trainer argvs only)."""
    argv = list(argv)
    if train_command and argv[:2] == TRAIN_COMMAND:
        argv = list(train_command) + argv[2:]
    if train_args_start(argv, train_command) is None:
        return argv
    return run_params.set_flag(run_params.apply(argv, params), "--out", out_dir)


async def launch(
    host: Host,
    argv: Sequence[str],
    *,
    session: str | None = None,
    params: dict | None = None,
    parent: str | None = None,
    train_command: Sequence[str] | None = None,
    resume_from: str | None = None,
    startup_s: float = STARTUP_S,
) -> RunInfo:
    """Start argv in a new detached tmux session with a run dir. Its items reach the
    program as they are (run as `"$@"` under the status-recording sh, never parsed), the
    program itself by the path the host's PATH gives it here.

    A pane that ends within `startup_s` other than with exit status 0 is a failed launch:
    RunError, quoting the pane's last lines. Its session and run dir are kept, to be read.

    `resume_from`, a checkpoint step directory on the host, is hard-linked into the new
    run's checkpoints (the trainer never rewrites a step's files, only replaces whole
    directories) and the trainer is started with `--resume`.
    """
    argv = list(argv)
    if not argv:
        raise RunError("nothing to launch: the command is empty")
    run_id = new_run_id()
    session = tmux.check_session_name(session or f"ts-{run_id}")
    is_train = train_args_start(argv, train_command) is not None
    params = run_params.check(params) if params is not None else (run_params.read(argv) if is_train else {})
    directory = await run_dir(host, run_id)
    if resume_from:
        if not is_train:
            raise RunError("only trainer runs can resume from a checkpoint")
        argv = [a for a in argv if a != "--resume"] + ["--resume"]
    command = await resolve_program(host, launch_command(argv, params, directory, train_command))
    manifest = {
        "run_id": run_id,
        "host": host.name,
        "session": session,
        "argv": argv,
        "command": command,
        "trainer": is_train,
        "params": params,
        "parent": parent,
        "resume_from": resume_from,
        "run_dir": directory,
        "started": now(),
        "ended": None,
        "exit_status": None,
        "pane_pid": None,
    }
    await write_manifest(host, manifest)
    if resume_from:
        await _link_checkpoint(host, resume_from, f"{directory}/checkpoints")
    recorded = ["sh", "-c", _RECORD_EXIT, "sh", f"{directory}/{EXIT_STATUS_FILE}", *command]
    try:
        pane_pid = await tmux.new_session(host, session, recorded, f"{directory}/console.log")
    except tmux.TmuxError:
        await host.run(["rm", "-rf", "--", directory])  # a run that never started leaves no trace
        raise
    manifest["pane_pid"] = pane_pid
    await write_manifest(host, manifest)
    ended = await _confirm_start(host, manifest, startup_s)
    return RunInfo(
        run_id, session, host.name, RunPhase.RUNNING if ended is None else RunPhase.EXITED, ended,
        params=params, pids=[pane_pid] if ended is None else [], run_dir=directory, parent=parent,
        started=manifest["started"],
    )  # fmt: skip


async def resolve_program(host: Host, command: list[str]) -> list[str]:
    """`command` with a bare program name replaced by its absolute path on the host.

    The pane's environment need not be the launcher's (`.venv/bin/trackside launch --
    trackside train` with the venv not activated; a host reached over SSH), and there a
    venv's `trackside` was not found: exit 127. Here, the caller's PATH and then this
    Python's own bin dir (where this trackside's console script lives); on any other
    host, the PATH the host gives a command.
    """
    if "/" in command[0]:
        return command
    if host.is_local:
        found = shutil.which(command[0], path=os.pathsep.join([os.environ.get("PATH", os.defpath), os.path.dirname(sys.executable)]))
        path = os.path.abspath(found) if found else ""
    else:
        result = await host.run(["sh", "-c", _WHICH, "sh", command[0]])
        path = result.stdout.strip() if result.ok else ""
    return [path, *command[1:]] if path.startswith("/") else command


async def _confirm_start(host: Host, manifest: dict, within_s: float) -> int | None:
    """None while the pane lives through its first `within_s`; 0 if it ended cleanly by
    then; RunError naming its status and quoting its last lines if it ended otherwise.
    With `within_s` 0 it does not look."""
    if within_s <= 0:
        return None
    deadline = time.monotonic() + within_s
    while True:
        own = [p for p in await tmux.list_panes(host, manifest["session"]) if p.pid == manifest["pane_pid"]]
        if not own or own[0].dead:
            break
        if time.monotonic() >= deadline:
            return None
        await asyncio.sleep(STARTUP_POLL_S)
    status = await read_exit_status(host, manifest["run_dir"])
    if status is None and own:
        status = own[0].exit_status
    await record_end(host, manifest, status)
    if status == 0:
        return 0
    last = await _last_lines(host, manifest["session"])
    how = (
        "ended with no exit status" if status is None
        else f"was killed by signal {-status}" if status < 0
        else f"exited with status {status}"
    )  # fmt: skip
    quoted = "".join(f"\n  | {line}" for line in last) or "\n  (it printed nothing)"
    raise RunError(
        f"{manifest['command'][0]} {how} within {within_s:g}s of its launch: run {manifest['run_id']} "
        f"failed to start (tmux session {manifest['session']} and its run dir are kept). Its pane's last lines:{quoted}"
    )


async def _last_lines(host: Host, session: str) -> list[str]:
    """The dead pane's last lines. tmux can mark a pane dead before it has drained the
    pane's output (the program's exit is seen first): a pane showing only tmux's own
    "Pane is dead" line is read again for a moment."""
    for _ in range(DRAIN_READS):
        try:
            shown = await tmux.capture_pane(host, session)
        except tmux.TmuxError:
            return []  # the session itself is gone
        lines = [line for line in shown.split("\n") if line.strip()]
        if any(not line.startswith("Pane is dead") for line in lines):
            break
        await asyncio.sleep(STARTUP_POLL_S)
    return lines[-FAILED_START_LINES:]


async def _link_checkpoint(host: Host, step_dir: str, checkpoints: str) -> None:
    result = await host.run(["sh", "-c", _LINK_CHECKPOINT, "sh", step_dir.rstrip("/"), checkpoints])
    if not result.ok:
        raise RunError(f"cannot link checkpoint {step_dir} into {checkpoints}: {result.stderr.strip()}")


async def latest_checkpoint(host: Host, run_dir: str) -> str | None:
    checkpoints = f"{run_dir}/checkpoints"
    result = await host.run(["sh", "-c", _LATEST_CHECKPOINT, "sh", checkpoints])
    name = result.stdout.strip()
    return f"{checkpoints}/{name}" if name else None


def parse_exit_status(text: str) -> int | None:
    """A recorded shell status: the code, or minus the signal (sh reports 128 + N)."""
    text = text.strip()
    if not text.isdigit():
        return None
    code = int(text)
    return -(code - 128) if 128 < code < 128 + 65 else code


async def read_exit_status(host: Host, directory: str) -> int | None:
    result = await host.run(["cat", f"{directory}/{EXIT_STATUS_FILE}"])
    return parse_exit_status(result.stdout) if result.ok else None


def _metrics_summary(lines: list[str]) -> dict:
    summary: dict = {"oom": False, "last_step": None, "last_loss": None, "steps_per_epoch": None,
                     "end_status": None}
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue  # a line being written as we read, or garbage: not ours to judge
        if not isinstance(event, dict):
            continue
        kind = event.get("event")
        if kind == "start":  # a resume starts again: an earlier end no longer holds
            summary["end_status"] = None
            if isinstance(event.get("steps_per_epoch"), int):
                summary["steps_per_epoch"] = event["steps_per_epoch"]
        elif kind == "step":
            summary["last_step"] = event.get("step", summary["last_step"])
            summary["last_loss"] = event.get("loss", summary["last_loss"])
        elif kind == "oom":
            summary["oom"] = True
        elif kind == "end" and isinstance(event.get("status"), str):
            summary["end_status"] = event["status"]
    return summary


def launcher_code(end_status: str | None, exit_status: int | None) -> bool:
    """Whether a nonzero exit code is the launcher's after the trainer's own clean end
    (torchrun exits 1 on a clean stop's SIGTERM though its workers saved and exited 0),
    not the run's failure."""
    return bool(exit_status) and end_status in ("completed", "stopped")


async def _read_run_dirs(host: Host) -> list[tuple[dict, int | None, dict]]:
    """(manifest, recorded exit status, metrics summary) for every run dir on the host."""
    result = await host.run(["sh", "-c", _READ_RUNS, "sh", await runs_root(host), str(METRICS_TAIL_LINES)])
    if not result.ok:
        raise HostError(host.name, f"cannot read run dirs: {result.stderr.strip()}")
    runs = []
    for record in result.stdout.split("\036")[1:]:
        head, _, metrics = record.partition("\035\n")
        head, _, status = head.partition("\034")
        _dir, _, manifest_text = head.partition("\n")
        try:
            manifest = json.loads(manifest_text)
        except ValueError:
            continue  # a manifest being replaced right now; it will be back next time
        if isinstance(manifest, dict) and manifest.get("run_id"):
            runs.append((manifest, parse_exit_status(status), _metrics_summary(metrics.splitlines())))
    return runs


def _state(exit_status: int | None, oom: bool, trainer: bool) -> RunPhase:
    # Exit code 3 means OOM only for our trainer; other programs use it freely.
    if oom or (trainer and exit_status == EXIT_OOM):
        return RunPhase.OOM
    return RunPhase.UNKNOWN if exit_status is None else RunPhase.EXITED


async def list_runs(host: Host) -> list[RunInfo]:
    """Our runs (newest first), then every tmux session we did not launch."""
    panes = await tmux.list_panes(host)
    dashboard = await own_sessions(host, panes)
    by_session: dict[str, list[tmux.Pane]] = {}
    for pane in panes:
        by_session.setdefault(pane.session, []).append(pane)
    claimed: set[str] = set()
    infos = []
    for manifest, recorded, metrics in sorted(await _read_run_dirs(host), key=lambda r: r[0]["run_id"], reverse=True):
        session = manifest.get("session", "")
        own = [p for p in by_session.get(session, []) if p.pid == manifest.get("pane_pid")]
        if own:
            claimed.add(session)
        alive = [p.pid for p in own if not p.dead]
        if manifest.get("ended") is not None:
            exit_status = manifest.get("exit_status")
        else:
            exit_status = recorded
            if exit_status is None and own and not alive:
                exit_status = own[0].exit_status  # sh itself was killed: tmux may know how
            if exit_status is not None:
                manifest = await record_end(host, manifest, exit_status)
        # A session that vanished without a recorded status stays UNKNOWN.
        ended = exit_status is not None or not alive
        state = _state(exit_status, metrics["oom"], bool(manifest.get("trainer"))) if ended else RunPhase.RUNNING
        infos.append(
            RunInfo(
                manifest["run_id"], session, host.name, state, exit_status, manifest.get("params", {}),
                metrics["last_step"], metrics["last_loss"], metrics["steps_per_epoch"], [] if ended else alive,
                manifest.get("run_dir"), manifest.get("parent"), manifest.get("started"), metrics["end_status"],
                this_dashboard=session in dashboard,
            )  # fmt: skip
        )
    foreign = [session for session in by_session if session not in claimed]
    # Foreign sessions are known by what their panes print; the dashboard's own pane
    # prints the dashboard, whose numbers are other runs'.
    consoles = await tmux.capture_panes(host, [session for session in foreign if session not in dashboard])
    for session in foreign:
        session_panes = by_session[session]
        alive = [p.pid for p in session_panes if not p.dead]
        status = None if alive else session_panes[0].exit_status
        said = console.summarize(consoles.get(session, "").split("\n"))
        infos.append(
            RunInfo(
                None, session, host.name, RunPhase.RUNNING if alive else _state(status, False, False), status,
                last_step=said.step, last_loss=said.loss, pids=alive, this_dashboard=session in dashboard,
                progress=said.progress,
            )  # fmt: skip
        )
    return infos


async def relaunch(host: Host, run_id: str, changes: dict, resume: bool = False, *, train_command: Sequence[str] | None = None) -> RunInfo:
    """The parent's argv with changed params, in a new run dir linked to its parent.

    With `resume`, the new run starts from the parent's latest checkpoint (the trainer's
    `--resume`, on a hard-linked copy of that checkpoint in the new run dir).
    """
    changes = run_params.check(changes)
    parent = await read_manifest(host, run_id)
    argv = [a for a in parent["argv"] if a != "--resume"]
    if train_args_start(argv, train_command) is None:
        raise RunError(f"run {run_id} is not a trainer run ({' '.join(argv)}): its parameters cannot be changed")
    resume_from = None
    if resume:
        resume_from = await latest_checkpoint(host, parent["run_dir"])
        if resume_from is None:
            raise RunError(f"run {run_id} has no checkpoint to resume from in {parent['run_dir']}/checkpoints")
    params = {**parent.get("params", {}), **changes}
    return await launch(
        host, run_params.apply(argv, params), params=params, parent=run_id,
        train_command=train_command, resume_from=resume_from,
    )  # fmt: skip
