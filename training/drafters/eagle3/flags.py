"""EAGLE-3's own flags, for `trackside train` and for `trackside fit`'s step: each defined
once, with the parameter table's range (training/params.py)."""
from __future__ import annotations

from training.params import PARAMS, add_param_flag


def add_flags(group, command: str) -> None:
    train = command == "train"
    add_param_flag(group, "ttt_steps", help=f"TTT depth (default {PARAMS['ttt_steps'].default})"
                   if train else "TTT depth (default: the run's, else 5)")
    if train:
        add_param_flag(group, "ttt_decay", help=f"default {PARAMS['ttt_decay'].default}")
        add_param_flag(group, "draft_vocab_size")
    add_param_flag(group, "checkpoint_ttt", metavar="N",
                   help="recompute the first N TTT steps in backward (bare: every step): each "
                   "saves its activations' share of the peak for about a third more of its "
                   "compute")
    add_param_flag(group, "freeze_lm_head", default=None,
                   help="keep the draft head at the verifier's instead of training it (as "
                   "speculators does): less compute and memory per step")
    group.add_argument("--offload-saved", action="store_true", default=None,
                       help="keep what backward needs later, and AdamW's state between steps, "
                       "in pinned host memory, not on the GPU (longer rows in less memory, for "
                       "the copies' time)")
    if not train:
        group.add_argument("--probe", action="store_true", default=None,
                           help="calibrate with a few real steps on this machine's GPU")
        group.add_argument("--calibration", help="calibration JSON (from --probe); with "
                           "--probe or --from-run, where the new calibration is written")
