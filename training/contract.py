"""What the trainer and the dashboard agree on, defined once: exit codes, the usage error
behind exit 2, run ids, runs root.

The trainer runs on a GPU box with torch; the dashboard and the headless commands run on
an operator's laptop without it. Both read these values, so this module imports nothing
of ours and nothing outside the standard library (import-linter lets `backends` and `tui`
import it and nothing else of `training` that loads torch).
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import time

# Exit codes of every `trackside` command and of the trainer.
EXIT_OK = 0
EXIT_FAILURE = 1  # anything else: an unreachable host, a missing run, a failed step
EXIT_USAGE = 2  # a bad argument or value; the message names the flag or key
EXIT_OOM = 3  # the trainer ran out of GPU memory, after writing its `oom` event
# The trainer stopped after --max-nonfinite steps in a row whose loss or gradient was not
# finite, none of them applied (training/nonfinite.py), after its end event "nonfinite".
EXIT_NONFINITE = 4
MAX_NONFINITE = 5  # the trainer's default --max-nonfinite


class UsageError(Exception):
    """A bad argument or value: exit 2 (EXIT_USAGE), the message naming the flag or key.

    An empty message means it was already said (rank 0 of a torchrun run speaks for
    every rank), so the one catching it prints nothing."""


class OneLineParser(argparse.ArgumentParser):
    """argparse whose mistake is a UsageError of one line, the flag and why (`--max-seq-len:
    must be ≥ 128 (got 10)`), never its usage text above it; whoever catches it names the
    command. Every `trackside` command parses with it."""

    def error(self, message: str):
        raise UsageError(message.removeprefix("argument "))


# A run id is the UTC minute it was made and 4 random hex digits: sorting ids sorts runs by
# start, and two launches in one minute differ but for 1 time in 65,536.
RUN_ID_TIME_FORMAT = "%Y%m%d-%H%M"
RUN_ID = re.compile(r"[0-9]{8}-[0-9]{4}-[0-9a-f]{4}")
RUN_ID_EXAMPLE = "20261129-0930-ab12"

# Where run directories live on a host unless its config says otherwise; the variable
# moves them on the machine it is set on (the trainer's `--out` default, a demo kept apart
# from real runs, and every command and dashboard reading this machine).
RUNS_ROOT = "~/.trackside/runs"
RUNS_ROOT_ENV = "TRACKSIDE_RUNS_ROOT"


def local_runs_root(environ: dict | None = None) -> str:
    """This machine's runs root where no config names one: $TRACKSIDE_RUNS_ROOT, else
    ~/.trackside/runs. The trainer writes there and every command reads there, so a run
    made under the variable is seen by `runs`, `plot`, `kill` and the dashboard alike."""
    return (os.environ if environ is None else environ).get(RUNS_ROOT_ENV) or RUNS_ROOT


def new_run_id() -> str:
    """A fresh run id, made now."""
    return f"{time.strftime(RUN_ID_TIME_FORMAT, time.gmtime())}-{secrets.token_hex(2)}"


# metrics.jsonl's events (training/metrics.py writes them, backends/logs/record.py folds them)
START, STEP, CHECKPOINT, OOM, END = "start", "step", "checkpoint", "oom", "end"
# A stopping trainer's state is off the device and a writer process (pid `writer`) is making
# it durable: its `checkpoint` event follows, maybe after the trainer's `end` (a checkpoint
# event always means a durable step directory).
STAGED = "staged"
# A step skipped, not applied: its loss or gradient norm (`what`) was not finite; the
# `in_a_row`-th such step in a row.
NONFINITE = "nonfinite"
# An end event's status; the last is also what a launcher's nonzero code after it is not.
COMPLETED, STOPPED, ENDED_OOM, FAILED = "completed", "stopped", "oom", "failed"
ENDED_NONFINITE = NONFINITE  # too many non-finite steps in a row
CLEAN_ENDS = (COMPLETED, STOPPED)
EVENT_FIELDS: dict[str, tuple[str, ...]] = {
    START: ("config", "steps_per_epoch", "world_size", "process_started", "startup_s"),
    STEP: ("step", "epoch", "loss", "loss_ttt", "acc_ttt", "lr", "grad_norm", "tokens",
           "tokens_per_s", "samples_per_row", "pad_frac", "peak_mem_gib"),
    CHECKPOINT: ("step", "path"),
    STAGED: ("step", "writer", "stage_s"),
    OOM: ("max_seq_len", "ttt_steps", "tried_gib", "peak_mem_gib"),
    NONFINITE: ("step", "what", "in_a_row"),
    END: ("status",),
}
# Fields an event carries only where they mean something.
OPTIONAL_FIELDS: dict[str, tuple[str, ...]] = {START: ("resume_source",),  # a resumed run's: one of RESUME_SOURCES
                                               STEP: ("peak_mem_gib_ranks",), OOM: ("block_size", "max_anchors"),
                                               CHECKPOINT: ("write_s",),
                                               # a failed end's why, and the newest whole checkpoint kept
                                               END: ("reason", "checkpoint")}

# Where a resumed run's state came from (its start event's resume_source): the stopped run's
# checkpoint writer's RAM, while it wrote (training/ram_stage.py), or the durable checkpoint.
RESUMED_FROM_RAM, RESUMED_FROM_DISK = RESUME_SOURCES = ("ram", "disk")

# When this process imported the contract, which the trainer's entry does first: its start,
# to a few milliseconds, on the trainer's own clock (a start event's `process_started`, so
# a relaunch's phases are timed with no skew between the dashboard's clock and the host's).
PROCESS_STARTED = time.time()

# `checkpoints/<WRITING_MARKER>` exists, locked, while a checkpoint writer writes
# (training/durable.py); the writer's process name, which a kill leaves to finish.
WRITING_MARKER = ".writing"
WRITER_NAME = "trackside-ckpt"
