"""What a run measured, read from its metrics.jsonl: its start event, its highest peak, and
which drafter it trained; each drafter's memory model reads its step shape from the start
event (training/drafters/*/memory, training/drafters/measured.py)."""
from __future__ import annotations

import json
from pathlib import Path


def start_and_peak(run_dir: str | Path) -> tuple[dict, float]:
    """The run's start event and the highest peak_mem_gib of its step events (every row
    has max_seq_len tokens, so every step has the same shape and the maximum is the
    steady state)."""
    path = Path(run_dir) / "metrics.jsonl"
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise ValueError(f"{path}: {e.strerror}") from e
    start, peaks = None, []
    for line in lines:
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a crash
        if not isinstance(event, dict):
            continue
        if event.get("event") == "start" and start is None:
            start = event
        elif event.get("event") == "step" and event.get("peak_mem_gib"):
            peaks.append(float(event["peak_mem_gib"]))
    if start is None:
        raise ValueError(f"{path}: no start event")
    if not peaks:
        raise ValueError(f"{path}: no step event with peak_mem_gib")
    return start, max(peaks)


def unmodelled_fp8(settings: dict) -> str | None:
    """Why a run of these settings (a start event's config, or an edit's params: both name
    it `fp8`) has no memory model, or None: an fp8 run's layers keep fp8 inputs and fp8
    copies of their weights, which the model's terms do not describe."""
    return "the memory model does not describe fp8 runs (--fp8)" if settings.get("fp8") else None


def start_config(start: dict) -> dict:
    """The run's config from its start event (ValueError if it is not a table, or the run
    did not train on a GPU in bf16)."""
    config = start.get("config") or {}
    if not isinstance(config, dict):  # a run dir may be anyone's: its events too
        raise ValueError("the start event's config is not a table")
    if config.get("device", "cuda") != "cuda":
        raise ValueError(f"the run trained on {config['device']}: its peak_mem_gib is the "
                         "process's resident set, not GPU memory")
    if unmodelled_fp8(config):
        raise ValueError(unmodelled_fp8(config))
    return config


def trained_drafter(config: dict) -> str:
    """The --drafter a run's config trained: a DFlash run's holds its knobs under `dflash`
    (training/loop.py's TrainConfig)."""
    return "dflash" if config.get("dflash") else "eagle3"
