"""The DFlash drafter: a block-diffusion drafter that fills a block of mask tokens after a
clean anchor in one non-causal pass, reading several verifier layers as context. Its
registration (training/drafters/spec.py); its torch code is imported when called."""
from __future__ import annotations

from training.config import DFLASH_PRESETS, DFlashConfig
from training.drafters.dflash.flags import add_flags
from training.drafters.spec import DrafterSpec


def _from_flags(args, dataset, max_seq_len: int) -> dict:
    from training.drafters.dflash.step import config_from_flags

    drafter, training = config_from_flags(args, dataset, max_seq_len)
    return {"drafter": drafter, "dflash": training}


def _for_run(cfg):
    from training.drafters.dflash.step import DFlash

    return DFlash(cfg.drafter, cfg.dflash, cfg.fp8)


def _fit(args) -> int:
    from training.drafters.dflash.fit import fit

    return fit(args)


def _export(checkpoint, out, verifier):
    from training.drafters.dflash.export import export_dflash

    return export_dflash(checkpoint, out, verifier=verifier)


# Exported after the run, in speculators' layout, once its checkpoint's writer is done.
SPEC = DrafterSpec(name="dflash", title="DFlash", shape=DFlashConfig, presets=DFLASH_PRESETS,
                   add_flags=add_flags, from_flags=_from_flags, for_run=_for_run, fit=_fit,
                   export=_export, exports_after_run=True)
