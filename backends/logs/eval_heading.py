"""An evaluation that does not say so on its loss's line: its heading is a line of its own
(the PyTorch quickstart's `Test Error: ` above ` Accuracy: 17.8%, Avg loss: 2.247451`), and
the next loss printed is the evaluation's, unless that line is one of the training loop's
own (a line like those that printed its training losses, numbers aside). A bar drawn, or a
line naming its step, ends the evaluation.
"""

from __future__ import annotations

import re

_HEADING = re.compile(r"\s*(?:test|testing|validation|validating|evaluation|evaluating|eval)\b[^\d]{0,40}", re.IGNORECASE)
_SHAPES = 16  # training lines' shapes remembered: a trainer prints few


class EvalHeading:
    def __init__(self) -> None:
        self._open = False
        self._training: set[str] = set()  # lines that printed a training loss, numbers blanked

    def heading(self, text: str) -> bool:
        """Whether `text` heads an evaluation (and so says nothing more)."""
        if _HEADING.fullmatch(text) is None:
            return False
        self._open = True
        return True

    def ended(self) -> None:
        self._open = False

    def read(self, fields: dict, shape: str, named: bool) -> dict:
        """A loss line's fields (`shape`: the line, numbers blanked): the evaluation's loss
        alone if it is the evaluation's line."""
        if not self._open or named:
            return fields
        self._open = False
        loss = next((v for k, v in fields.items() if "loss" in k), None)
        return fields if shape in self._training or loss is None else {"eval_loss": loss}

    def trained(self, shape: str) -> None:
        """A line of this shape printed a training loss."""
        if len(self._training) >= _SHAPES:
            self._training.clear()
        self._training.add(shape)
