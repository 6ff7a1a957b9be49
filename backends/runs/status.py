"""How a run stands, in the words every view uses: the fleet, the run screen, `trackside
runs`, its JSON, `watch`. Decided here once from what the listing and the run's own events
say; the screens add only colour.
"""

from __future__ import annotations

import enum
import signal
import time

from backends.logs.logparse import Progress
from backends.runs.listing import RunInfo, RunPhase, launcher_code
from training.contract import COMPLETED, ENDED_NONFINITE, FAILED, STOPPED


class RunStatus(enum.Enum):
    """What a run is doing. Failures (a nonzero exit, a signal, OOM) are the red ones."""

    RUNNING = "running"
    FINISHED = "finished"  # the trainer completed, or the command exited 0
    STOPPED = "stopped"  # the trainer saved and stopped when asked (SIGTERM), or was stopped from here
    FAILED = "failed"  # a nonzero exit of its own
    KILLED = "killed"  # ended by a signal it did not handle
    OOM = "OOM"
    UNKNOWN = "unknown"  # not running, and how it ended was not recorded
    GONE = "gone"  # no longer in the host's listing
    EXITED = "exited"  # a session's program returned to its shell, its exit code not said
    UNREADABLE = "unreadable"  # its run dir's manifest is no manifest (the listing says why)
    STOP_INTERRUPTED = "stop interrupted"  # a kill that did not finish: some of its processes live
    # the trainer stopped after steps in a row whose loss or gradient was not finite (none applied)
    NONFINITE = "nonfinite"

    @property
    def label(self) -> str:
        return self.value

    @property
    def failed(self) -> bool:
        return self in (RunStatus.FAILED, RunStatus.KILLED, RunStatus.OOM, RunStatus.NONFINITE)


def status_of(info: RunInfo, *, end: str | None = None, oom: bool = False, gone: bool = False, stopped_here: bool = False) -> RunStatus:
    """A run's status from its listing and, where a dashboard follows it, its own events
    (`end`: its end event's status; `oom`: an oom event). The trainer's own end comes
    before the exit code: after it, a nonzero code is the launcher's (launcher_code)."""
    if gone:
        return RunStatus.STOPPED if stopped_here else RunStatus.GONE
    if info.state is RunPhase.UNREADABLE:
        return RunStatus.UNREADABLE
    if info.stop is not None:
        return RunStatus.STOP_INTERRUPTED
    if oom or info.state is RunPhase.OOM:
        return RunStatus.OOM
    if info.state is RunPhase.RUNNING:
        return RunStatus.RUNNING
    if info.state is RunPhase.EXITED and info.exit_status is None and info.run_id is None:
        return RunStatus.EXITED
    end = end or info.end_status
    if end == ENDED_NONFINITE:
        return RunStatus.NONFINITE
    code = info.exit_status
    if end == COMPLETED:
        return RunStatus.FINISHED
    if end == STOPPED or stopped_here:
        return RunStatus.STOPPED
    if code is None:
        return RunStatus.FAILED if end == FAILED else RunStatus.UNKNOWN
    if code < 0:
        return RunStatus.KILLED
    return RunStatus.FAILED if code or end == FAILED else RunStatus.FINISHED


def status_words(status: RunStatus, exit_status: int | None, progress: Progress | None = None, stop: dict | None = None) -> str:
    """The status in a few words: its label, what ended it, how far an interrupted kill
    got (`stop`, RunInfo's), or, for a run with no step events yet, the phase its
    console's bar is in (`progress`)."""
    code = exit_status
    if status is RunStatus.STOP_INTERRUPTED and stop is not None:
        alive = f"{stop['alive']} process{'es' if stop['alive'] != 1 else ''}"
        return f"{status.label}: SIG{stop['signal']} at {time.strftime('%H:%M', time.localtime(stop['time']))}, {alive} still alive"
    if status is RunStatus.RUNNING and progress is not None:
        return progress.phase
    if status is RunStatus.KILLED:
        return f"killed ({signal_name(-code)})"
    if status is RunStatus.FAILED and code:
        return f"failed ({code})"
    return status.label


def describe(info: RunInfo) -> str:
    """A listed run's status in words, as the fleet shows it (the listing knows no kill
    from a dashboard and no event the listing did not read)."""
    if info.unreadable is not None:
        return f"{RunStatus.UNREADABLE.label}: {info.unreadable}"
    return status_words(status_of(info), info.exit_status, info.progress, info.stop)


def node_words(state: str, code: int | None, end_status: str | None) -> tuple[str, RunStatus]:
    """One node of a multi-node run: its words and the status they stand for (torchrun's
    exit 1 after the trainer's own clean end is no death)."""
    if state == RunPhase.RUNNING.value:
        return RunStatus.RUNNING.label, RunStatus.RUNNING
    if state == RunPhase.OOM.value:
        return RunStatus.OOM.label, RunStatus.OOM
    if state == RunPhase.UNKNOWN.value or code is None:
        return RunStatus.UNKNOWN.label, RunStatus.UNKNOWN
    if code == 0 or launcher_code(end_status, code):
        return f"exited ({code})", RunStatus.STOPPED
    if code < 0:
        return f"killed ({signal_name(-code)})", RunStatus.KILLED
    return f"failed ({code})", RunStatus.FAILED


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
