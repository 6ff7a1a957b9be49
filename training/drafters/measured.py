"""The drafter and step shape a run's start event describes, read by the memory model of
the drafter it trained (training/memory/measured.py tells which): what the dashboard's
edit cost and the benchmarks read of any run. Plain arithmetic, as those models are."""
from __future__ import annotations

from training.drafters.dflash import memory as dflash_memory
from training.drafters.eagle3 import memory as eagle3_memory
from training.memory.measured import start_config, trained_drafter

_READERS = {"eagle3": eagle3_memory.shape_from_start, "dflash": dflash_memory.shape_from_start}


def shape_from_start(start: dict):
    """(config, step shape) of an EAGLE-3 or a DFlash run (ValueError if it cannot be
    read, or the run did not train on a GPU)."""
    return _READERS[trained_drafter(start_config(start))](start)
