"""What a drafter registers (training/drafters/__init__.py): its `--drafter` name, its
shape and presets, its own flags, the run they ask for, its part of the training loop,
its `trackside fit` report and its export. Standard library only: the registry is read
to build a parser before anything imports torch; each drafter's callables import its
torch code when called."""
from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class DrafterSpec:
    name: str  # its --drafter value
    title: str  # as a message names it
    shape: type  # its shape's class (training/config.py): a run's TrainConfig.drafter
    presets: Mapping[str, Any]  # its shapes by --preset name
    # Its own flags on a parser or group, for "train" or "fit"; each defined once.
    add_flags: Callable[[Any, str], None]
    # TrainConfig's fields for the run `trackside train`'s flags ask for (args, the data
    # set, max_seq_len): its shape fitted to the data, a flag that does not fit refused.
    from_flags: Callable[[argparse.Namespace, Any, int], dict]
    for_run: Callable[[Any], Any]  # its part of the loop (drafter.Drafter) for a TrainConfig
    fit: Callable[[argparse.Namespace], int]  # `trackside fit`: its report printed; the exit code
    # A checkpoint exported for serving (checkpoint dir, out dir, the verifier's name).
    export: Callable[[Path, Path, str | None], Path]
    # Where `train --export` exports: False, the loop, before its end event; True, the
    # command, after the run, once the checkpoint's writer is done.
    exports_after_run: bool = False

    def own_flags(self, command: str) -> list[str]:
        """Its flags for the command, as typed (--ttt-steps)."""
        parser = argparse.ArgumentParser(add_help=False)
        self.add_flags(parser, command)
        return ["--" + dest.replace("_", "-") for dest in vars(parser.parse_args([]))]

    def given(self, args: argparse.Namespace, command: str) -> list[str]:
        """Its flags that args holds a value of."""
        return [flag for flag in self.own_flags(command)
                if getattr(args, flag[2:].replace("-", "_")) is not None]
