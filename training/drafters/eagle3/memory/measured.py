"""What an EAGLE-3 run measured: its drafter, step shape and peak, from its metrics.jsonl."""
from __future__ import annotations

from pathlib import Path

from training.config import DrafterConfig
from training.drafters.eagle3.memory.calibrate import Measurement
from training.drafters.eagle3.memory.terms import StepShape
from training.memory.measured import start_and_peak, start_config, trained_drafter
from training.memory.units import GiB
from training.params import count_recomputed


def measurements_from_run(run_dir: str | Path) -> tuple[DrafterConfig, StepShape, Measurement]:
    """The EAGLE-3 drafter, step shape and measured peak of a finished run."""
    start, peak = start_and_peak(run_dir)
    if trained_drafter(start_config(start)) != "eagle3":
        raise ValueError(f"{run_dir} trained a DFlash drafter: fit --drafter dflash")
    cfg, shape = shape_from_start(start)
    return cfg, shape, Measurement(shape.max_seq_len, shape.ttt_steps, round(peak * GiB))


def shape_from_start(start: dict) -> tuple[DrafterConfig, StepShape]:
    """The EAGLE-3 drafter and step shape a run's `start` event describes (ValueError if it
    cannot be read, or the run did not train on a GPU)."""
    config = start_config(start)
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
