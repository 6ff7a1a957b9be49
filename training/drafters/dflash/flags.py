"""DFlash's own flags, for `trackside train` and for `trackside fit`'s step: each defined
once, with the parameter table's range (training/params.py)."""
from __future__ import annotations

from training.params import PARAMS, add_param_flag, layer_list


def add_flags(group, command: str) -> None:
    train = command == "train"
    given = "" if train else "the run's, "  # fit --from-run: the run's own
    add_param_flag(group, "block_size", help="an anchor and block_size - 1 tokens drafted at "
                   f"once (default: {given}the preset's)")
    add_param_flag(group, "max_anchors", help=f"blocks drawn per packed row (default: {given}"
                   f"the preset's, else {PARAMS['max_anchors'].default}, at most max_seq_len)")
    add_param_flag(group, "soft_kl", help="share of KL to the verifier's distribution blended "
                   f"into the cross-entropy (default: {given}the preset's, else "
                   f"{PARAMS['soft_kl'].default:g})")
    if train:
        add_param_flag(group, "dflash_gamma", help="block offset k weighs exp(-(k-1)/gamma) "
                       f"(default: the preset's, else {PARAMS['dflash_gamma'].default})")
        add_param_flag(group, "num_layers", help="draft layers")
        group.add_argument("--target-layers", type=layer_list,
                           help="verifier layers read as context, a,b,… (default the data's)")
