"""What a console said: its last loss and step, its progress, and its loss curve.

A trainer that writes no metrics.jsonl (a session trackside did not launch, or another
program launched with it) is known only by what it prints. The dashboard folds the lines
it follows into a ConsoleSummary, and `trackside runs` folds a capture of the pane's
scrollback, here, so the command line shows what the screen shows.

Where steps come from: the step a line names (`step=12`, `iter 100:`, `"step": 3`);
failing that, the training bar's count (tqdm, `Step N/M`), with the bars before it added
when one bar is drawn per epoch; failing that, one step per loss line. HF Trainer's loss
dicts name no step and sit above the bar that counts them, so the losses printed since the
last point are spread evenly up to the bar's count: trainers log every so many steps.
"""

from __future__ import annotations

import dataclasses
import re
from collections import deque
from collections.abc import Iterable

from backends.logparse import Progress, parse_console_line, parse_progress, redraws, step_of, visible_text

CURVE_POINTS = 5000  # (step, loss) points kept: a run that logs for days stays bounded
# Bars that count something other than training steps, whatever their phase says.
_NOT_TRAINING = re.compile(r"eval|valid|test|predict|generat", re.IGNORECASE)


class ConsoleSummary:
    """Lines folded in so far, in order; `add` more as they come."""

    def __init__(self) -> None:
        self.loss: float | None = None
        self.step: int | None = None
        self.progress: Progress | None = None  # of the latest bar or N/M counter, any phase
        self.curve: deque[tuple[int, float]] = deque(maxlen=CURVE_POINTS)
        self._named = False  # a line named its step: from then on bars never set it
        self._bar: Progress | None = None  # the latest training bar
        self._before_bar = 0  # steps counted by the training bars before that one
        self._unplaced: list[float] = []  # losses whose step the next bar will tell

    def add(self, lines: Iterable[str]) -> None:
        """Lines as a screen shows them (a pane's capture, a log's lines)."""
        for line in lines:
            self._read(visible_text(line))
        # Not held across calls: a batch's losses are shown with it, up to the last bar's count.
        self._place(self.step)

    def add_recorded(self, text: str) -> None:
        """What a pane printed, as recorded: every redraw of a bar is read, not only its last."""
        for line in text.split("\n"):
            for state in redraws(line):
                self._read(state)
        self._place(self.step)

    def _read(self, text: str) -> None:
        bar_step = None
        if "/" in text and (progress := parse_progress(text)) is not None:
            if progress.phase == "working" and self.curve:
                # A bare bar between loss lines is the training loop's.
                progress = dataclasses.replace(progress, phase="training")
            self.progress = progress
            bar_step = self._bar_step(progress)
            if bar_step is not None and not self._named:
                self._place(bar_step)
                self.step = bar_step
        fields = parse_console_line(text)
        # HF Trainer's evaluation and end-of-training dicts carry `*_runtime`: their
        # losses are averages over a run or a data set, not a step's.
        if fields is None or "loss" not in fields or any(k.endswith("runtime") for k in fields):
            return
        loss = fields["loss"]
        self.loss = loss
        named = step_of(fields)
        if named is not None:
            self._named = True
            self._place(named)
            self.curve.append((named, loss))
            self.step = named
        elif bar_step is not None:  # a tqdm postfix: the loss of the bar's own step
            self.curve.append((bar_step, loss))
        else:
            self._unplaced.append(loss)

    def _bar_step(self, bar: Progress) -> int | None:
        """The training step a bar shows, or None if it counts something else."""
        if bar.phase not in ("training", "working") or _NOT_TRAINING.search(bar.label):
            return None
        last = self._bar
        if last is not None:
            if bar.total < last.total:
                return None  # a shorter bar in between (an evaluation): not the training's
            # A bar that starts again, or follows a finished one, is the next epoch's.
            if bar.done < last.done or (last.done == last.total and bar != last):
                self._before_bar += last.total
        self._bar = bar
        return self._before_bar + bar.done

    def _place(self, end: int | None) -> None:
        """Give the unplaced losses steps: evenly up to `end` when there is room, else one
        step each after the last point."""
        if not self._unplaced:
            return
        start = self.curve[-1][0] if self.curve else 0
        count = len(self._unplaced)
        if end is not None and end - start >= count:
            steps = [start + round((i + 1) * (end - start) / count) for i in range(count)]
        else:
            steps = list(range(start + 1, start + count + 1))
        self.curve.extend(zip(steps, self._unplaced))
        self._unplaced.clear()
        if self.step is None or steps[-1] > self.step:
            self.step = steps[-1]


def summarize(lines: Iterable[str]) -> ConsoleSummary:
    summary = ConsoleSummary()
    summary.add(lines)
    return summary
