"""Scoped kill: a plan that names a run's own processes (plan.py), that plan carried out,
then proof that the run's GPU memory is released (stop.py), and the report of it
(report.py). Callers import from here.
"""

from backends.kill.plan import AlreadyEnded, KillError, KillPlan, SelfKill, plan_kill
from backends.kill.report import GpuDelta, KillReport, holding
from backends.kill.stop import (
    DURABLE_WAIT_S,
    GRACE_S,
    KILL_WAIT_S,
    PANE_EXIT_WAIT_S,
    kill_run,
)

__all__ = [
    "DURABLE_WAIT_S",
    "GRACE_S",
    "KILL_WAIT_S",
    "PANE_EXIT_WAIT_S",
    "AlreadyEnded",
    "GpuDelta",
    "KillError",
    "KillPlan",
    "KillReport",
    "SelfKill",
    "holding",
    "kill_run",
    "plan_kill",
]
