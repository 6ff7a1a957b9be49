"""What a run measured: its drafter, step shape and peak, read from its metrics.jsonl."""
from __future__ import annotations

import json
from pathlib import Path

from training.config import DrafterConfig
from training.memory.calibrate import Measurement
from training.memory.terms import GiB, StepShape


def measurements_from_run(run_dir: str | Path) -> tuple[DrafterConfig, StepShape, Measurement]:
    """The drafter, step shape and measured peak of a finished run, from its metrics.jsonl.

    The start event's config gives the shape; the highest peak_mem_gib of its step events
    is the measured peak (every row has max_seq_len tokens, so every step has the same
    shape and the maximum is the steady state).
    """
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
    cfg, shape = shape_from_start(start)
    return cfg, shape, Measurement(shape.max_seq_len, shape.ttt_steps,
                                   round(max(peaks) * GiB))


def shape_from_start(start: dict) -> tuple[DrafterConfig, StepShape]:
    """The drafter and step shape a run's `start` event describes (ValueError if it
    cannot be read, or the run did not train on a GPU)."""
    config = start.get("config") or {}
    if config.get("device", "cuda") != "cuda":
        raise ValueError(f"the run trained on {config['device']}: its peak_mem_gib is the "
                         "process's resident set, not GPU memory")
    try:
        cfg = DrafterConfig.from_dict(config["model"])
        checkpointed = config.get("checkpoint_ttt", 0)
        if isinstance(checkpointed, bool):  # runs from before partial checkpointing
            checkpointed = int(config["ttt_steps"]) if checkpointed else 0
        shape = StepShape(max_seq_len=int(config["max_seq_len"]),
                          ttt_steps=int(config["ttt_steps"]),
                          batch_rows=int(config.get("batch_rows", 1)),
                          loss_chunk=int(config.get("loss_chunk", 2048)),
                          precision=config.get("precision", "bf16"),
                          world_size=int(start.get("world_size", 1)),
                          sharding=config.get("sharding", "ddp"),
                          checkpoint_ttt=int(checkpointed),
                          freeze_lm_head=bool(config.get("freeze_lm_head", False)))
    except KeyError as e:
        raise ValueError(f"the start event's config lacks {e.args[0]}") from e
    except (TypeError, ValueError) as e:
        raise ValueError(f"the start event's config is not usable: {e}") from e
    return cfg, shape
