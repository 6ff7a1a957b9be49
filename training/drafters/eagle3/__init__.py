"""EAGLE-3: a one-layer drafter unrolled over TTT steps, on the verifier's three captured
layers and a draft vocabulary. Its registration (training/drafters/spec.py); its torch
code is imported when called."""
from __future__ import annotations

from training.config import PRESETS, DrafterConfig
from training.drafters.eagle3.flags import add_flags
from training.drafters.spec import DrafterSpec


def _from_flags(args, dataset, max_seq_len: int) -> dict:
    from training.drafters.eagle3.step import from_flags

    return from_flags(args, dataset)


def _for_run(cfg):
    from training.drafters.eagle3.step import Eagle3

    return Eagle3(cfg.drafter, cfg.ttt_steps, cfg.ttt_decay, cfg.checkpoint_ttt,
                  cfg.freeze_lm_head, cfg.offload_saved, cfg.fp8)


def _fit(args) -> int:
    from training.drafters.eagle3.fit import fit

    return fit(args)


def _export(checkpoint, out, verifier):  # its layout names no verifier
    from training.drafters.eagle3.export import export_drafter

    return export_drafter(checkpoint, out)


SPEC = DrafterSpec(name="eagle3", title="EAGLE-3", shape=DrafterConfig, presets=PRESETS,
                   add_flags=add_flags, from_flags=_from_flags, for_run=_for_run, fit=_fit,
                   export=_export)
