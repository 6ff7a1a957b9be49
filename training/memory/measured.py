"""What a run measured: its drafter, step shape and peak, read from its metrics.jsonl."""
from __future__ import annotations

import json
from pathlib import Path

from training.config import DFlashConfig, DrafterConfig
from training.memory.calibrate import Measurement
from training.memory.dflash import DFlashShape
from training.memory.terms import StepShape
from training.memory.units import GiB
from training.params import count_recomputed


def _start_and_peak(run_dir: str | Path) -> tuple[dict, float]:
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


def measurements_from_run(run_dir: str | Path) -> tuple[DrafterConfig, StepShape, Measurement]:
    """The EAGLE-3 drafter, step shape and measured peak of a finished run."""
    start, peak = _start_and_peak(run_dir)
    cfg, shape = shape_from_start(start)
    if isinstance(shape, DFlashShape):
        raise ValueError(f"{run_dir} trained a DFlash drafter: fit --drafter dflash")
    return cfg, shape, Measurement(shape.max_seq_len, shape.ttt_steps, round(peak * GiB))


def dflash_from_run(run_dir: str | Path) -> tuple[DFlashConfig, DFlashShape, int]:
    """The DFlash drafter, step shape and measured peak (bytes) of a finished run."""
    start, peak = _start_and_peak(run_dir)
    cfg, shape = shape_from_start(start)
    if not isinstance(shape, DFlashShape):
        raise ValueError(f"{run_dir} trained an EAGLE-3 drafter, not DFlash")
    return cfg, shape, round(peak * GiB)


def shape_from_start(start: dict) -> tuple[DrafterConfig, StepShape] | tuple[DFlashConfig,
                                                                            DFlashShape]:
    """The drafter and step shape a run's `start` event describes, an EAGLE-3 or a DFlash
    one (ValueError if it cannot be read, or the run did not train on a GPU)."""
    config = start.get("config") or {}
    if not isinstance(config, dict):  # a run dir may be anyone's: its events too
        raise ValueError("the start event's config is not a table")
    if config.get("device", "cuda") != "cuda":
        raise ValueError(f"the run trained on {config['device']}: its peak_mem_gib is the "
                         "process's resident set, not GPU memory")
    if config.get("dflash"):
        return _dflash_shape(start, config)
    try:
        cfg = DrafterConfig.from_dict(config["model"])
        ttt_steps = int(config["ttt_steps"])
        checkpointed = min(count_recomputed(config.get("checkpoint_ttt", 0)), ttt_steps)
        shape = StepShape(max_seq_len=int(config["max_seq_len"]),
                          ttt_steps=ttt_steps,
                          batch_rows=int(config.get("batch_rows", 1)),
                          loss_chunk=int(config.get("loss_chunk", 2048)),
                          precision=config.get("precision", "bf16"),
                          world_size=int(start.get("world_size", 1)),
                          sharding=config.get("sharding", "ddp"),
                          checkpoint_ttt=int(checkpointed),
                          freeze_lm_head=bool(config.get("freeze_lm_head", False)),
                          offload_saved=bool(config.get("offload_saved", False)))
    except KeyError as e:
        raise ValueError(f"the start event's config lacks {e.args[0]}") from e
    except (TypeError, ValueError, AttributeError) as e:  # a field of another type than the trainer writes
        raise ValueError(f"the start event's config is not usable: {e}") from e
    return cfg, shape


def _dflash_shape(start: dict, config: dict) -> tuple[DFlashConfig, DFlashShape]:
    try:
        dflash = config["dflash"]
        cfg = DFlashConfig.from_dict(config["model"])
        return cfg, DFlashShape(max_seq_len=int(config["max_seq_len"]),
                                max_anchors=int(dflash["max_anchors"]),
                                soft_kl=float(dflash["soft_kl"]),
                                batch_rows=int(config.get("batch_rows", 1)),
                                loss_chunk=int(config.get("loss_chunk", 2048)),
                                precision=config.get("precision", "bf16"),
                                world_size=int(start.get("world_size", 1)),
                                sharding=config.get("sharding", "ddp"))
    except KeyError as e:
        raise ValueError(f"the start event's config lacks {e.args[0]}") from e
    except (TypeError, ValueError, AttributeError) as e:  # a field of another type than the trainer writes
        raise ValueError(f"the start event's config is not usable: {e}") from e
