"""The drafters, by their `--drafter` name: one folder each (eagle3/, dflash/), whose
__init__.py makes the DrafterSpec (spec.py) registered here. `trackside train` and `fit`
(training/cli.py, training/fit.py) take each drafter's flags from here, and the training
loop asks here which drafter a run trains: none of them names a drafter. What the loop
asks of one is drafter.py."""
from __future__ import annotations

import argparse

from training.drafters.dflash import SPEC as DFLASH
from training.drafters.eagle3 import SPEC as EAGLE3
from training.drafters.spec import DrafterSpec

DRAFTERS: dict[str, DrafterSpec] = {spec.name: spec for spec in (EAGLE3, DFLASH)}
DEFAULT = EAGLE3.name


def spec_of(shape) -> DrafterSpec:
    """The drafter whose shape a run trains (its TrainConfig.drafter)."""
    return next(spec for spec in DRAFTERS.values() if isinstance(shape, spec.shape))


def add_flags(parser: argparse.ArgumentParser, command: str) -> None:
    """Every drafter's own flags for `command` ("train" or "fit"), a group each."""
    for spec in DRAFTERS.values():
        spec.add_flags(parser.add_argument_group(f"{spec.title} (--drafter {spec.name})"),
                       command)


def foreign_flags(args: argparse.Namespace, command: str) -> tuple[DrafterSpec, list[str]] | None:
    """The first drafter other than args.drafter whose own flags args gives, and those
    flags: the run's drafter would silently ignore them."""
    for spec in DRAFTERS.values():
        given = spec.given(args, command) if spec.name != args.drafter else []
        if given:
            return spec, given
    return None


def presets_help() -> str:
    return "; ".join(f"{spec.title}: {', '.join(sorted(spec.presets))}"
                     for spec in DRAFTERS.values())
