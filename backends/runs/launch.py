"""Launching a run: a command started in a new tmux session with a run directory, its
start confirmed; and relaunching one with changed parameters."""

from __future__ import annotations

import asyncio
import os
import posixpath
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields

from backends import params as run_params
from backends import tmux
from backends.hosts import Host
from backends.logs import recording
from backends.logs.logparse import parse_metrics_line
from backends.runs.listing import RunInfo, RunPhase
from backends.runs.rundir import (
    EXIT_STATUS_FILE,
    RunError,
    check_run_id,
    checkpoints_to_resume,
    make_run_dir,
    now,
    read_exit_status,
    read_manifest,
    record_end,
    run_dir,
    write_manifest,
)
from backends.runs.sessions import parent_session_name, session_name
from backends.ship import Shipped
from backends.ship.deliver import Sent
from training.contract import new_run_id

TRAIN_COMMAND = ["trackside", "train"]  # the trainer, where a host configures no other
# A launch is judged by how its program starts. The trainer's start is its first metrics
# event, written once it has loaded its model and data and begun the loop: a pane that dies
# before it, at whatever second, failed to start; one still loading after START_WAIT_S is
# left running, not judged. Any other program has no such event: a pane that dies within
# STARTUP_S, but for a clean exit, failed to start.
STARTUP_S = 2.0
START_WAIT_S = 60.0
STARTUP_POLL_S = 0.1
START_POLL_S = 0.5  # past STARTUP_S: a trainer loading for a minute is read 120 times, not 600
FAILED_START_LINES = 15  # of the pane, quoted in a failed launch's error
DRAIN_READS = 10  # of a dead pane still showing none of its output, STARTUP_POLL_S apart

# The path the host's PATH gives program "$1" (a shell builtin gives its bare name).
_WHICH = 'command -v "$1"'

# The pane runs the command under this sh, which records its exit status in "$1": tmux
# 3.3 sometimes shows a dead pane without one. The traps are handlers, not ignores, so the
# command still gets the default actions; sh itself waits for it, then writes the file.
# umask 077: what the run writes in its run dir (metrics, checkpoints) is its user's alone.
_RECORD_EXIT = 'umask 077; f=$1; shift; trap : HUP INT TERM; "$@"; s=$?; echo "$s" > "$f"; exit "$s"'


@dataclass
class Launched(RunInfo):
    """A launch's result: the run as the listing shows it, and how its start was judged
    (`judged`, in words: started by its start event, alive after the short window, still
    loading, or ended cleanly)."""

    judged: str = ""
    # A relaunch that could not take its parent's session name: where the run went instead.
    session_note: str = ""

    def to_json(self) -> dict:
        listed = RunInfo(**{f.name: getattr(self, f.name) for f in fields(RunInfo)})
        return {**listed.to_json(), "judged": self.judged, **({"session_note": self.session_note} if self.session_note else {})}


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
    start_wait_s: float = START_WAIT_S,
    run_id: str | None = None,
    wrap: Callable[[list[str]], list[str]] | None = None,
    extra: dict | None = None,
    on_started: Callable[[RunInfo], None] | None = None,
    sent: Sent | None = None,
    after_pids: Sequence[int] = (),
) -> Launched:
    """Start argv in a new detached tmux session with a run dir. Its items reach the
    program as they are (run as `"$@"` under the status-recording sh, never parsed), the
    program itself by the path the host's PATH gives it here.

    A failed launch is a RunError quoting the pane's last lines; its session and run dir
    are kept, to be read. The trainer, launched alone, fails if its pane ends before its
    first metrics event (waited for up to `start_wait_s`); any other program, and a node of
    a multi-node run (only one node writes events), if its pane ends within `startup_s`.
    An exit status 0 is never a failed launch. With `startup_s` 0 nothing is waited for.

    `resume_from`, another run's checkpoints directory on the host, is where the trainer
    starts from (`--resume-from`): its newest checkpoint, once a writer still making it
    durable is done, so a relaunch need not wait for the write before it starts.

    A node of a multi-node run (backends/nodes/launch.py) passes the run id its nodes share,
    `wrap` (the resolved command → the torchrun that runs it) and `extra` manifest fields.

    `sent` (backends.ship.deliver), code already on the host and in place: the trainer runs
    from its shipped package, and the manifest records what the run runs.

    `after_pids`, the processes of a run still stopping that this one replaces: the
    trainer starts now and waits for them to end before it touches the device (its
    `--after-pids`, in the command run, not in the argv a relaunch edits).
    """
    argv = list(argv)
    if not argv:
        raise RunError("nothing to launch: the command is empty")
    run_id = check_run_id(run_id) if run_id else new_run_id()
    session = tmux.check_session_name(session or session_name(run_id))
    is_train = train_args_start(argv, train_command) is not None
    params = run_params.check(params) if params is not None else (run_params.read(argv) if is_train else {})
    directory = await run_dir(host, run_id)
    if resume_from:
        if not is_train:
            raise RunError("only trainer runs can resume from a checkpoint")
        argv = [*_without_resume(argv), "--resume-from", resume_from]
    run_argv, run_train = argv, train_command
    if sent is not None and sent.code is not None:
        if not is_train:
            raise RunError("only the trainer runs a shipped package: sync the program's directory instead")
        run_train = sent.code.train_command()
        run_argv = run_train + argv[train_args_start(argv, train_command) :]
    if after_pids:
        if not is_train:
            raise RunError("only the trainer waits for the run it replaces")
        run_argv = [*run_argv, "--after-pids", ",".join(map(str, after_pids))]
    command = await resolve_program(host, launch_command(run_argv, params, directory, run_train))
    if wrap is not None:
        command = wrap(command)
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
        **(sent.manifest() if sent is not None else {}),
        **(extra or {}),
    }
    await make_run_dir(host, directory)
    recorded = ["sh", "-c", _RECORD_EXIT, "sh", f"{directory}/{EXIT_STATUS_FILE}", *command]
    try:
        await write_manifest(host, manifest)
        pane_pid = await tmux.new_session(host, session, recorded, recording.recorder(f"{directory}/console.log"))
    except Exception:
        await host.run(["rm", "-rf", "--", directory])  # a run that never started (a full disk, tmux's refusal) leaves no trace
        raise
    manifest["pane_pid"] = pane_pid
    await write_manifest(host, manifest)
    if on_started is not None:  # running, not yet judged: a dashboard shows it starting
        on_started(RunInfo(run_id, session, host.name, RunPhase.RUNNING, params=params, pids=[pane_pid],
                           run_dir=directory, parent=parent, started=manifest["started"]))  # fmt: skip
    by_event = is_train and wrap is None  # of a multi-node run's nodes, only one writes events
    ended, judged = await _confirm_start(host, manifest, startup_s, start_wait_s if by_event else None)
    return Launched(
        run_id, session, host.name, RunPhase.RUNNING if ended is None else RunPhase.EXITED, ended,
        params=params, pids=[pane_pid] if ended is None else [], run_dir=directory, parent=parent,
        started=manifest["started"], judged=judged,
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


async def _confirm_start(host: Host, manifest: dict, window_s: float, wait_s: float | None) -> tuple[int | None, str]:
    """(None while the pane lives, or 0 if it ended cleanly; how that was judged in words).

    With `wait_s` (the trainer), the pane is watched until the run's first metrics event,
    for up to `wait_s`; else for `window_s`. A pane that ends otherwise than with status 0
    meanwhile is a RunError naming its status and quoting its last lines. With `window_s`
    0 it does not look."""
    if window_s <= 0:
        return None, "not waited for"
    began = time.monotonic()
    while True:
        own = [p for p in await tmux.list_panes(host, manifest["session"]) if p.pid == manifest["pane_pid"]]
        if not own or own[0].dead:
            break
        waited = time.monotonic() - began
        if wait_s is not None and await _first_event(host, manifest["run_dir"]):
            return None, f"started: its start event came {waited:.1f}s after its launch"
        if wait_s is None and waited >= window_s:
            return None, f"alive after {window_s:g}s (no start event waited for)"
        if wait_s is not None and waited >= wait_s:
            return None, f"still loading after {wait_s:g}s: no start event yet, not judged"
        await asyncio.sleep(STARTUP_POLL_S if waited < STARTUP_S else START_POLL_S)
    waited = time.monotonic() - began
    status = await read_exit_status(host, manifest["run_dir"])
    if status is None and own:
        status = own[0].exit_status
    await record_end(host, manifest, status)
    if status == 0:
        return 0, f"ended with exit status 0 {waited:.1f}s after its launch"
    last = await _last_lines(host, manifest["session"])
    how = (
        "ended with no exit status" if status is None
        else f"was killed by signal {-status}" if status < 0
        else f"exited with status {status}"
    )  # fmt: skip
    when = f"{waited:.1f}s after its launch, before its start event" if wait_s is not None else f"within {window_s:g}s of its launch"
    quoted = "".join(f"\n  | {line}" for line in last) or "\n  (it printed nothing)"
    raise RunError(
        f"{manifest['command'][0]} {how} {when}: run {manifest['run_id']} "
        f"failed to start (tmux session {manifest['session']} and its run dir are kept). Its pane's last lines:{quoted}"
    )


async def _first_event(host: Host, directory: str) -> bool:
    """Whether the run's metrics.jsonl holds a whole first event (the trainer's start)."""
    result = await host.run(["head", "-n", "1", f"{directory}/metrics.jsonl"])
    return result.ok and result.stdout.endswith("\n") and parse_metrics_line(result.stdout) is not None


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


@dataclass(frozen=True)
class Parent:
    """A run to be launched again, as its manifest on its host says: read once, by
    backends.relaunch, which decides from it how the run is relaunched and hands it on."""

    host: Host
    run_id: str
    manifest: dict

    @classmethod
    async def read(cls, host: Host, run_id: str) -> Parent:
        return cls(host, run_id, await read_manifest(host, run_id))

    @property
    def nodes(self) -> list[dict]:
        """The hosts, sessions and run dirs of a multi-node run's nodes (backends.nodes); none
        for a run on one host."""
        return self.manifest.get("nodes") or []


async def relaunch(parent: Parent, changes: dict, resume: bool = False, *, train_command: Sequence[str] | None = None,
                   on_started: Callable[[RunInfo], None] | None = None, sent: Sent | None = None,
                   after_pids: Sequence[int] = ()) -> Launched:
    """The parent's argv with changed params, in a new run dir on its host linked to it: a
    run on one host (backends.relaunch decides which runs are).

    With `resume`, the new run starts from the parent's latest checkpoint (the trainer's
    `--resume-from` the parent's checkpoints), one still being written included, or with
    `after_pids` (the parent still stopping) the one its stop is about to save.
    With `sent`, it runs that code (backends.ship.deliver); without, the code its parent ran:
    the parent's shipped package where it had one, else the host's trainer.
    """
    host, run_id, manifest = parent.host, parent.run_id, parent.manifest
    argv = _without_resume(manifest["argv"])
    resume_from = None
    if train_args_start(argv, train_command) is None:
        # Another program (a trainer of the user's, its directory synced): the same argv
        # again, the one thing a relaunch can do with a command it cannot read.
        if changes or resume:
            raise RunError(f"run {run_id} is not a trainer run ({' '.join(argv)}): its parameters cannot be changed")
        params = manifest.get("params") or {}
    else:
        if resume and after_pids:
            # The parent is still stopping: the checkpoint its stop saves comes after this
            # launch. The trainer waits for the parent's processes, then for the writer, and
            # refuses to start if there is still none (`--resume-from` requires one).
            resume_from = f"{manifest['run_dir']}/checkpoints"
        elif resume:
            resume_from = await checkpoints_to_resume(host, manifest["run_dir"])
            if resume_from is None:
                raise RunError(f"run {run_id} has no checkpoint to resume from in {manifest['run_dir']}/checkpoints")
        argv, params = run_params.edited(argv, manifest.get("params", {}), changes)
    if sent is None and manifest.get("code"):
        sent = Sent(Shipped.of_record(manifest["code"]))
    session, note = await parent_session_name(host, manifest)
    launched = await launch(
        host, argv, session=session, params=params, parent=run_id,
        train_command=train_command, resume_from=resume_from, on_started=on_started, sent=sent,
        after_pids=after_pids,
    )  # fmt: skip
    if note:
        launched.session_note = f"{note}: this run is in tmux session {launched.session}"
    return launched


def _without_resume(argv: Sequence[str]) -> list[str]:
    """argv without the resume it started with: a relaunch resumes only when asked, from
    its parent."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--resume-from":
            skip = True
        elif arg != "--resume" and not arg.startswith("--resume-from="):
            kept.append(arg)
    return kept
