"""The `trackside` command: one entry point that hands each subcommand to its module of
tui/commands/, and `train|extract|fit` to the trainer's (training/cli.py).

Imports are deferred so that `trackside train` on a GPU box needs torch only, and the
headless commands never load textual.
"""

from __future__ import annotations

import importlib.util
import os
import sys

from training.contract import EXIT_FAILURE, EXIT_USAGE
from tui.commands import SUMMARIES

TRAINING_COMMANDS = {"train", "extract", "fit"}
# What the trainer's commands import, which the dashboard's install (no `train` extra) lacks.
NEEDS = {"train": ("torch",), "extract": ("torch", "transformers", "safetensors")}
# The headless commands, each its module of tui/commands/ (imported when asked for: the
# headless ones never load textual).
HEADLESS = {"launch", "runs", "gpus", "kill", "relaunch"}
OWN_COMMANDS = {"plot", "watch", "serve", "record", "replay"}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv else ""
    try:
        if command in TRAINING_COMMANDS:
            missing = [name for name in NEEDS.get(command, ()) if importlib.util.find_spec(name) is None]
            if missing:
                print(f"trackside {command}: needs {', '.join(missing)}, which this install lacks: "
                      f"pip install 'trackside[train]'", file=sys.stderr)  # fmt: skip
                return EXIT_FAILURE
            from training.cli import main as training_main

            return training_main(argv)
        if command in HEADLESS:
            from tui.commands.headless import main as headless_main

            return headless_main(argv)
        if command in OWN_COMMANDS:
            return importlib.import_module(f"tui.commands.{command}").main(argv[1:])
        if command and not command.startswith("-") and command not in SUMMARIES:
            print(f"trackside: {command!r} is not a command (trackside --help lists them)", file=sys.stderr)
            return EXIT_USAGE
    except BrokenPipeError:
        # The reader went away (`trackside runs | head -1`): stop without a traceback, as
        # other command-line tools do; what is still buffered goes to /dev/null, so the
        # interpreter's exit does not fail on it again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILURE
    from tui.commands.dashboard import main as dashboard_main

    return dashboard_main(argv)


def program() -> int:
    """The `trackside` program: main, and a trainer's process ended the quick way once
    its work is written (training.cli.exit_process)."""
    code = main()
    if sys.argv[1:2] == ["train"]:
        from training.cli import exit_process

        exit_process(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
