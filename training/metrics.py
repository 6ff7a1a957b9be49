"""metrics.jsonl: the trainer's half of the contract with the dashboard
(docs/design.md).

One JSON object per line, appended and flushed as it happens, so `tail -F` over SSH sees
every event the moment it exists. Only rank 0 writes; other ranks get a writer that
drops everything, so the loop needs no `if rank == 0` around each event.

Events and fields:
  start       time, config, steps_per_epoch, world_size, process_started (the process's start),
              startup_s (seconds of each phase before it: imports_device, data, model, resume;
              replaced_run under --after-pids; resume_wait, of resume, waiting for a
              checkpoint writer where the durable checkpoint was read);
              a resumed run's also resume_source: "ram" (the state read from the stopped
              run's checkpoint writer, training/ram_stage.py) or "disk"
  step        time, step, epoch, loss, loss_ttt, acc_ttt, lr, grad_norm, tokens,
              tokens_per_s, samples_per_row, pad_frac, peak_mem_gib (rank 0's);
              with world_size > 1 also peak_mem_gib_ranks (every rank's, by rank)
              a DFlash run's: loss_pos, acc_pos (per block offset) and tau in place of
              loss_ttt and acc_ttt
  checkpoint  time, step, path (a durable step directory); the writer's also write_s
  staged      time, step, writer, stage_s (a stopping trainer's state off the device; its
              writer process's checkpoint event follows, maybe after the end)
  oom         time, max_seq_len, ttt_steps, tried_gib, peak_mem_gib; a DFlash run's also
              block_size, max_anchors (and ttt_steps null)
  nonfinite   time, step (the one not applied), what ("loss" or "grad_norm": which was
              not finite), in_a_row (training/nonfinite.py)
  end         time, status ("completed", "stopped", "oom", "failed", "nonfinite"); a
              full disk's failed end also reason and checkpoint (the newest whole one
              kept, or null)

`step` counts optimizer steps done (the first is 1); `epoch` is the 0-based epoch the step's
batch came from; `tokens` are the step's non-padding tokens over all ranks.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from training.contract import EVENT_FIELDS, OPTIONAL_FIELDS, STEP

# A DFlash run's step event: per block offset where EAGLE-3 reports per TTT step.
DFLASH_STEP_FIELDS: tuple[str, ...] = tuple(
    f for f in EVENT_FIELDS[STEP] if f not in ("loss_ttt", "acc_ttt")) + (
    "loss_pos", "acc_pos", "tau")


class MetricsWriter:
    def __init__(self, path: Path | None):
        """path None: a writer for ranks other than 0, which writes nothing."""
        self._file = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "a", encoding="utf-8")

    def write(self, event: str, **fields) -> None:
        expected, optional = EVENT_FIELDS[event], OPTIONAL_FIELDS.get(event, ())
        if event == STEP and "loss_pos" in fields:
            expected = DFLASH_STEP_FIELDS
        if not set(expected) <= set(fields) <= {*expected, *optional}:
            raise ValueError(f"{event} event needs {expected} (optional: {optional}), got {sorted(fields)}")
        if self._file is None:
            return
        record = {"event": event, "time": time.time(), **fields}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
