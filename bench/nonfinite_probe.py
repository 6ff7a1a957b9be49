"""The trainer under a watch for the first non-finite tensor: `python bench/nonfinite_probe.py
train …` runs `trackside train …` with a forward hook on every module that names the first
whose output is not finite, and autograd's anomaly mode, which names the backward function
that first made a NaN (with the forward line that built it). For a run that trains NaN,
one call finds where.
"""
from __future__ import annotations

import sys

import torch

from training.cli import main

seen: list[str] = []


def _report(module, inputs, output) -> None:
    if seen:
        return
    tensors = output if isinstance(output, (tuple, list)) else (output,)
    for t in tensors:
        if torch.is_tensor(t) and t.is_floating_point() and not torch.isfinite(t).all():
            seen.append(type(module).__name__)
            ins = [bool(torch.isfinite(i).all()) for i in inputs
                   if torch.is_tensor(i) and i.is_floating_point()]
            print(f"nonfinite_probe: first non-finite output: {type(module).__name__} "
                  f"shape {tuple(t.shape)} dtype {t.dtype}; inputs finite: {ins}", flush=True)
            return


if __name__ == "__main__":
    torch.nn.modules.module.register_module_forward_hook(_report)
    torch.autograd.set_detect_anomaly(True)
    sys.exit(main(sys.argv[1:]))
