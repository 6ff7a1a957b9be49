"""Runs: commands started in tmux with a run directory, and every other tmux session.

`rundir` is the run directory on its host (manifest, exit status, checkpoints), `launch`
starts and relaunches runs, `listing` lists them with how each stands. Callers import from
here.
"""

from backends.runs.launch import (
    STARTUP_S,
    TRAIN_COMMAND,
    Launched,
    Parent,
    launch,
    launch_command,
    relaunch,
    resolve_program,
    train_args_start,
)
from backends.runs.listing import (
    NodeInfo,
    RunInfo,
    RunPhase,
    code_differs,
    code_of,
    launcher_code,
    list_runs,
)
from backends.runs.rundir import (
    RunError,
    manifest_exit_status,
    read_exit_status,
    read_file,
    read_manifest,
    record_end,
    run_dir,
)
from backends.runs.sessions import named_by_user, parent_session_name, session_name
from training.contract import RUN_ID

__all__ = [
    "RUN_ID",
    "STARTUP_S",
    "TRAIN_COMMAND",
    "Launched",
    "Parent",
    "NodeInfo",
    "RunError",
    "RunInfo",
    "RunPhase",
    "code_differs",
    "code_of",
    "launch",
    "launch_command",
    "launcher_code",
    "list_runs",
    "manifest_exit_status",
    "read_exit_status",
    "read_file",
    "read_manifest",
    "record_end",
    "relaunch",
    "resolve_program",
    "run_dir",
    "session_name",
    "train_args_start",
]
