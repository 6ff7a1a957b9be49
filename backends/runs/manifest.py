"""A run's manifest.json as read: the type of every field it may hold, checked in one place.

A manifest may be anyone's (a runs root another user can write, a file written by hand or
by another program). One whose text is not JSON, or whose fields trackside knows have the
wrong type, is refused whole with a reason naming the first wrong field: no view ever meets
a session that is a number, params that are a list or a start time that is no time. The
listing shows such a run dir as one "unreadable" row; `read_manifest` raises RunError.
Fields trackside does not know are kept and never read.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from backends import params as run_params
from backends.untrusted_json import loads
from training.contract import RUN_ID

MAX_BYTES = 1 << 20  # a launch's manifest is a few KiB; more is read as far as this, then refused
# The trainer's and the launcher's clock, as both write it (rundir.now).
TIME = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z")
LARGEST_PID = 2**31 - 1


class ManifestError(ValueError):
    """Why a manifest cannot be read, in one line."""


def _shown(value: Any) -> str:
    """A value in a reason: its kind, and a scalar's first characters (it may be anyone's)."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


Check = Callable[[str, Any], None]  # (where in the manifest, its value): raises ManifestError


def _kind(what: str, test: Callable[[Any], bool]) -> Check:
    def check(where: str, value: Any) -> None:
        if not test(value):
            raise ManifestError(f"{where}: expected {what}, got {_shown(value)}")

    return check


def _whole(low: int, high: int) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and low <= v <= high


def _nullable(check: Check) -> Check:
    def nullable(where: str, value: Any) -> None:
        if value is not None:
            check(where, value)

    return nullable


def _list_of(check: Check) -> Check:
    def each(where: str, value: Any) -> None:
        if not isinstance(value, list):
            raise ManifestError(f"{where}: expected a list, got {_shown(value)}")
        for i, item in enumerate(value):
            check(f"{where}[{i}]", item)

    return each


def _object(fields: dict[str, Check], required: tuple[str, ...] = ()) -> Check:
    def table(where: str, value: Any) -> None:
        if not isinstance(value, dict):
            raise ManifestError(f"{where}: expected an object, got {_shown(value)}")
        for key in required:
            if key not in value:
                raise ManifestError(f"{where}.{key}: missing")
        for key, check in fields.items():
            if key in value:
                check(f"{where}.{key}" if where else key, value[key])

    return table


def _params(where: str, value: Any) -> None:
    if not isinstance(value, dict):
        raise ManifestError(f"{where}: expected an object, got {_shown(value)}")
    try:
        run_params.check(value)  # the trainer's own table: names, kinds and ranges
    except run_params.ParamError as e:
        raise ManifestError(f"{where}.{e}") from None


TEXT = _kind("text", lambda v: isinstance(v, str))
TEXTS = _list_of(TEXT)
FLAG = _kind("true or false", lambda v: isinstance(v, bool))
A_RUN_ID = _kind("a run id", lambda v: isinstance(v, str) and RUN_ID.fullmatch(v) is not None)
A_TIME = _kind("a time like 2026-11-29T09:30:00Z", lambda v: isinstance(v, str) and TIME.fullmatch(v) is not None)
A_NUMBER = _kind("a number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v))

# Every field a launch (backends/runs/launch.py), a registered run (training/register.py), a
# multi-node launch (backends/nodes/) and shipped or synced code (backends/ship/deliver.py) write.
SHAPE = _object({
    "run_id": A_RUN_ID,
    "host": TEXT,
    "session": TEXT,
    "argv": TEXTS,
    "command": TEXTS,
    "trainer": FLAG,
    "registered": FLAG,
    "params": _params,
    "parent": _nullable(A_RUN_ID),
    "resume_from": _nullable(TEXT),
    "run_dir": TEXT,
    "started": _nullable(A_TIME),
    "ended": _nullable(A_TIME),
    "exit_status": _nullable(_kind("an exit status", _whole(-128, 255))),  # the shell's 0-255, or minus a signal
    "pane_pid": _nullable(_kind("a process id", _whole(1, LARGEST_PID))),
    "code": _nullable(_object({key: TEXT for key in ("hash", "source", "dir", "python", "package")} | {"describe": _nullable(TEXT)})),
    "synced": _list_of(_object({"from": TEXT, "to": TEXT, "hash": TEXT, "describe": _nullable(TEXT), "exclude": TEXTS, "max_mib": A_NUMBER})),
    "nodes": _list_of(_object({"host": TEXT, "session": _nullable(TEXT), "run_dir": _nullable(TEXT)}, required=("host",))),
    "node": _nullable(_kind("a node number", _whole(0, 1 << 16))),
    "nproc_per_node": _kind("a process count", _whole(1, 1 << 16)),
    "rdzv_endpoint": TEXT,
})  # fmt: skip


def parse_manifest(text: str, run_id: str) -> dict:
    """The manifest of run dir `run_id` from its file's text (at most MAX_BYTES of it);
    ManifestError, why not. A run id it names is its dir's: a copy under another name
    would be listed twice, and found by the other's id."""
    if len(text) > MAX_BYTES:
        raise ManifestError(f"larger than {MAX_BYTES >> 10} KiB")
    try:
        value = loads(text)
    except ValueError as e:
        raise ManifestError(f"not JSON: {e}") from None
    if not isinstance(value, dict):
        raise ManifestError(f"expected a JSON object, got {_shown(value)}")
    SHAPE("", value)
    if value.get("run_id", run_id) != run_id:
        raise ManifestError(f"run_id: {value['run_id']} in the run dir of {run_id}")
    return value
