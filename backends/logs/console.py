"""What a console said: its training and evaluation losses by step, its progress, its ETA.

A trainer that writes no metrics.jsonl is known only by what it prints: each pane's
recorded output is folded here (backends.logs.panes), every redraw of a bar included, and a
console.log or a pane's capture the same way, so the command line and the screen agree.

Where a step comes from, first that applies:
- the step a line names (`step=12`, `iter 100:`, `"step": 3`, `iteration 10/ 100`), a
  boosting round (backends.logs.rounds) or a table's row (backends.logs.libraries.tables), as printed;
- a training bar's count: the run's own when the bar counts the run (HF Trainer's), else
  the epoch's, made global with the bar's epoch: Lightning's `Epoch E:` tqdm bar and
  `Epoch E/M ━━` Rich bar count epochs from 0, Keras' `Epoch E/M` line above its bars from
  1, another `Epoch E` bar from 0 once an epoch 0 was seen (from 1 once E reached M);
  until then its steps are not known, and none is shown;
- a loss printed above the bar that counts it (HF Trainer's dicts, written as tqdm.write
  does, the bar drawn again below with its count) takes that next count: several are
  spread evenly from the last point up to it. A Rich bar's metrics line, below the bar,
  takes the bar's count.
A loss with no step anywhere (no bar, no counter) is kept in order (`counted`): the curve's
x then counts losses, and the step shown stays unknown.

A count is a step only when it is the training loop's bar's (backends.logs.training_bar: told
by its shape and what comes with it, never by the bar nearest a loss) or labelled as one:
`Map: 2000/2000` and `Accuracy: 209/360` are not. Evaluation losses (`eval_loss`, a
validation or test line, the loss after a heading such as `Test Error:`) are their own
series, at the step they were printed at; a bar's postfix repeats the last one, so only a
new value is a new point. Bars that count something else are progress only.
"""

from __future__ import annotations

import dataclasses
import re
from collections import deque
from collections.abc import Iterable

from backends.logs.boxes import Box
from backends.logs.eval_heading import EvalHeading
from backends.logs.libraries import line_readers
from backends.logs.logparse import Progress, parse_console_line, parse_progress, step_of
from backends.logs.rounds import parse_round
from backends.logs.screen import Terminal, visible_text
from backends.logs.training_bar import TrainingBar
from backends.logs.wrapped import INDENT, Wrapped

CURVE_POINTS = 5000  # (step, loss) points kept per series: a run that logs for days stays bounded
_EVALUATING = re.compile(r"eval|valid|test", re.IGNORECASE)
# Keras' epoch header, a line of its own above the epoch's bars.
_KERAS_EPOCH = re.compile(r"\s*Epoch (\d{1,9})/(\d{1,9})\s*")
_NUMBERS = re.compile(r"[-+]?\d[\d.,]*(?:[eE][-+]?\d+)?")


class ConsoleSummary:
    """Lines folded in so far, in order; `add` or `add_recorded` more as they come."""

    def __init__(self) -> None:
        self.loss: float | None = None  # the latest training loss
        self.eval_loss: float | None = None
        self.step: int | None = None
        self.progress: Progress | None = None  # of the latest bar or N/M counter, any phase
        self.total_steps: int | None = None  # the run's, where its bars tell it
        self.curve: deque[tuple[int, float]] = deque(maxlen=CURVE_POINTS)
        self.eval_curve: deque[tuple[int, float]] = deque(maxlen=CURVE_POINTS)
        self.counted = False  # the curve's x counts losses: nothing printed a step
        self._named = False  # a line named its step: from then on bars never set it
        self._bar: Progress | None = None  # the latest training bar
        self._before_bar = 0  # steps of the bare bars before that one (a bar per epoch, no label)
        self._unplaced: list[float] = []  # training losses whose step the next bar tells
        self._eval_unplaced: float | None = None  # an evaluation's loss, likewise
        self._keras_epoch: tuple[int, int] | None = None
        self._epoch_base: int | None = None  # 0 or 1: how an `Epoch E` label counts, once known
        self._rich_step: int | None = None  # the Rich bar just drawn: its metrics line follows
        # A tqdm postfix's loss drawn before the bar counts its step (`for batch in
        # tqdm(loader)`: the loop sets the loss, the count moves when the next batch is
        # taken): known when the first training bar shows a loss at count 0.
        self._postfix_leads = False
        self._postfix_at: tuple[int, int] = (-1, 0)  # the count its postfix is drawn at, new losses there
        self._evaluated_at: int | None = None  # the step an evaluation's bar was drawn at
        self._wrapped = Wrapped()  # a record Rich's log handler wrapped, held until whole
        self._box = Box()  # a record printed as a box of rows (stable-baselines3's)
        self._screen = False  # folding a screen's lines, not a recording
        self._shape = ""  # the line that named the last step, its numbers blanked
        self._counts = "step"  # what the steps named count: a boosting library's rounds, a table's epochs
        self._readers = line_readers()  # of lines in a library's own shape
        self._bars = TrainingBar()  # which bar is the training loop's
        self._new_epoch = False  # the latest training bar is a new epoch's, the one before ended the last
        self._heading = EvalHeading()
        self._tty = Terminal()  # what the recorded bytes drew so far (add_recorded)

    # --- input ----------------------------------------------------------------------

    def add(self, lines: Iterable[str]) -> None:
        """Lines as a screen shows them (a pane's capture): each bar in its last state only,
        so no bar is the next one drawn after an evaluation, and none dates it."""
        self._screen = True
        for line in lines:
            self._read(visible_text(line))
        self._screen = False

    def add_recorded(self, text: str) -> None:
        """What a pane printed, as recorded, on from the last call: every state a terminal
        drew is read (each redraw of a bar, not only its last); a line not ended yet is
        read once it is, unless it is a tqdm bar drawn whole (its `]` closes it): that is
        this moment's state, read now, not at its next redraw, which a ten-minute step
        would delay ten minutes (read again then, it changes nothing)."""
        for state in self._tty.feed(text):
            self._read(state)
        drawing = self._tty.drawing()
        if drawing.endswith("]") and "%|" in drawing:
            self._read(self._tty.take())

    def settle(self) -> None:
        """Nothing more is coming (a whole capture read, a pane that died): a record still
        held is folded, the losses still waiting for a bar take the last step known (an
        evaluation's does not: some trainers date it at the next step)."""
        for state in self._tty.flush():  # a last line no newline ended: drawn, so read
            self._read(state)
        for held in self._wrapped.flush():
            self._fold(held)
        self._place(self.step)
        self._eval_unplaced = None  # no bar told its step: trainers date evaluations differently

    # --- what it says ---------------------------------------------------------------

    @property
    def axis(self) -> str:
        """What the curves' x counts: the library's steps, its boosting rounds, its table's
        epochs, or (nothing said which step a loss was) the losses printed, in order."""
        return "point" if self.counted else self._counts

    @property
    def eta_s(self) -> float | None:
        """Seconds to the run's last step at the training bar's pace: the bar's own ETA when
        it counts the whole run, else its seconds a step times the steps left in the run."""
        bar = self._bar
        if bar is None or bar.eta_s is None:
            return None
        if self.total_steps is None:
            return bar.eta_s if bar.epoch is None and bar.kind != "keras" else None
        if self.step is None or bar.done >= bar.total:
            return None
        return bar.eta_s / (bar.total - bar.done) * max(0, self.total_steps - self.step)

    # --- folding --------------------------------------------------------------------

    def _read(self, text: str) -> None:
        """A line; a record a logger wrapped over several (backends.logs.wrapped) or printed as a
        box (backends.logs.boxes) folded once whole."""
        boxed, record = self._box.read(text)
        if boxed:
            if record is not None:
                self._fold(record)
            return
        records, line = self._wrapped.read(text)
        for record in records:
            self._fold(record)
        if line is not None and not (line.startswith(INDENT) and not line.startswith(3 * INDENT) and self._rich_step is None):
            self._fold(line)  # (the wrapped rest of a line that was no record is not read alone; one past column 48 is a line)

    def _fold(self, text: str) -> None:
        if (epoch := _KERAS_EPOCH.fullmatch(text)) is not None:
            self._keras_epoch = int(epoch[1]), int(epoch[2])
            return
        if (boosted := parse_round(text)) is not None:
            self._numbered(boosted.number, boosted.loss, boosted.eval_loss, "round")
            return
        for reader in self._readers:
            if (row := reader.read(text)) is not False:
                if row is not True:
                    if "/" in text and (bar := parse_progress(text)) is not None:
                        self.progress = dataclasses.replace(bar, phase="training")  # the library's own loop's bar
                    self._numbered(row[0], row[1].get("loss"), row[1].get("eval_loss"), reader.counts)
                return
        bar_step = None
        progress = parse_progress(text) if "/" in text else None
        if progress is None and not text.startswith(INDENT):
            self._rich_step = None  # a line of its own: what follows is not the bar's
        fields = parse_console_line(text)
        if progress is not None:
            self._heading.ended()
            training = self._bars.drawn(progress, fields is not None and "loss" in fields)
            if training:
                progress = dataclasses.replace(progress, phase="training")
            self.progress = progress
            if _EVALUATING.search(progress.label) and self.step:
                self._evaluated_at = self.step
            if progress.kind == "tqdm" and "v_num=" in text:
                self._epoch_base = 0  # Lightning's bar (its logger's version in the postfix)
            bar_step = self._bar_step(progress) if training else None
            self._rich_step = bar_step if progress.kind == "rich" else None
            if bar_step is not None:
                self._placed_by_bar(bar_step)
            if not training and fields is not None:
                fields.pop("loss", None)  # another bar's postfix (an evaluation's): no training step's
        elif self._heading.heading(text):
            return
        # HF Trainer's end-of-training dict carries `train_runtime`: its loss is the run's
        # average, not a step's (an evaluation's dict carries `eval_runtime` and its loss).
        if fields is None or (any(k.endswith("runtime") for k in fields) and "eval_loss" not in fields):
            return
        named = step_of(fields)
        shape = _NUMBERS.sub("#", text)
        if progress is None:
            fields = self._heading.read(fields, shape, named is not None)
        self._named |= named is not None
        step, postfix = named, False
        if step is None and progress is not None:
            step, postfix = bar_step, progress.kind != "keras"  # Keras draws each step's count and loss
        elif step is None and self._rich_step is not None and text.startswith(INDENT):
            step, postfix = self._rich_step, True  # a Rich bar's metrics, wrapped below it
        if (value := fields.get("eval_loss")) is not None:
            self._evaluated(value, step, postfix=postfix)
        if postfix and "loss" in fields:
            step = None if step is None else self._postfix_step(step, progress, fields["loss"])
        if (value := fields.get("loss")) is not None:
            if progress is None:
                self._heading.trained(shape)
                if (bar := self._bars.loss_printed()) is not None:
                    self._under_way(bar)
            if step is not None and (step > 0 or not postfix):
                # A step below the last starts the series again only from a line like the
                # ones that logged it (a resumed run); `best loss 2.6 at step 400` does not.
                _point(self.curve, step, value, restart=named is not None and shape == self._shape)
                if named is not None:
                    self._shape = shape
                self._advance(step)
                if named is not None:
                    self._eval_unplaced = None  # steps went on without a bar: its step is not known
            elif progress is None and not postfix:
                self._unplaced.append(value)
                self._eval_unplaced = None  # an evaluation between losses no bar counted: its step is not known
            self.loss = value
            if self._unplaced and self._bar is None and not self._named:
                self._place(None)  # nothing here counts steps: keep them in order

    def _postfix_step(self, count: int, bar: Progress | None, loss: float) -> int | None:
        """The step whose loss a bar's postfix (or Rich's metrics) shows, or None. Bars draw
        their count only every so often (tqdm's `miniters`, Rich's refresh rate), the
        postfix at each change: only the first new loss drawn at a count is known to be
        that count's step (or the next one's, when the postfix leads); the ones after it at
        the same count are steps whose numbers the bar never said, and a loss drawn again
        is no step."""
        if count == 0 and self.loss is None and bar is not None and bar.kind == "tqdm":
            self._postfix_leads = True
        if bar is not None and bar.kind == "ignite":
            self._postfix_leads = True  # its handler sets the iteration's loss, then moves the count
        at, new = self._postfix_at
        if count != at:
            at, new = count, 0
        fresh = loss != self.loss
        new += fresh
        self._postfix_at = at, new
        if not fresh or new != 1:
            return None
        # At the bar's end there is no next step for the postfix to lead to.
        return count + (self._postfix_leads and bar is not None and bar.done < bar.total)

    def _evaluated(self, value: float, step: int | None, *, postfix: bool) -> None:
        if postfix:
            # A postfix repeats the last evaluation's loss, a new one first drawn wherever
            # the bar was next drawn whole: it is the evaluation's whose bar was seen last.
            if value == self.eval_loss:
                return
            self.eval_loss, step, self._evaluated_at = value, self._evaluated_at, None
            if step is not None:
                _point(self.eval_curve, step, value)
            return
        if step is not None and self.eval_curve and self.eval_curve[-1][0] == step:
            return  # the first evaluation at a step is the run's (Megatron follows its validation with the test set's)
        self.eval_loss = value
        if step is not None:
            _point(self.eval_curve, step, value, restart=True)
        elif step is None and not self._unplaced:
            self._eval_unplaced = value  # the next bar's count, unless losses come first

    def _under_way(self, bar: Progress) -> None:
        """The bar under way when a loss was printed, now known to be the training loop's:
        the count it showed is a step."""
        self.progress = dataclasses.replace(bar, phase="training")
        if (step := self._bar_step(bar)) is not None:
            self._placed_by_bar(step)

    def _numbered(self, number: int, loss: float | None, eval_loss: float | None, counts: str) -> None:
        """A boosting round's line (backends.logs.rounds) or a table's row (backends.logs.libraries.tables): its
        number is the step, as printed, counting `counts`."""
        self._named, self._counts = True, counts
        if loss is not None:
            _point(self.curve, number, loss)
            self.loss = loss
        if eval_loss is not None:
            _point(self.eval_curve, number, eval_loss)
            self.eval_loss = eval_loss
        self._advance(number)

    def _bar_step(self, bar: Progress) -> int | None:
        """The step a training bar shows, or None if its epoch's place in the run is not
        known."""
        epoch, epochs, base = bar.epoch, bar.epochs, None
        if bar.kind == "keras":
            if self._keras_epoch is None:
                return None
            (epoch, epochs), base = self._keras_epoch, 1
        elif bar.kind == "rich" and epoch is not None:
            base, epochs = 0, None if epochs is None else epochs + 1  # Lightning's `Epoch E/max-1`
        elif epoch is not None:
            if bar.epoch_from is not None:
                self._epoch_base = bar.epoch_from
            elif self._bar is None and bar.done == 0 and epoch in (0, 1):
                self._epoch_base = epoch  # the run's first bar, from its start: its first epoch
            elif epoch == 0:
                self._epoch_base = 0
            elif epochs is not None and epoch == epochs and self._epoch_base is None:
                self._epoch_base = 1
            base = self._epoch_base
        if epoch is not None:
            self._new_epoch = self._bar is not None and self._bar.epoch is not None and self._bar.epoch != epoch
            self._bar = bar
            if base is None or epoch < base:
                return None
            if epochs is not None:
                self.total_steps = epochs * bar.total
            return (epoch - base) * bar.total + bar.done
        last = self._bar
        if last is not None and last.epoch is None:
            if bar.total < last.total:
                return None  # a shorter bar in between (an evaluation): not the training's
            # A bar that starts again is the next epoch's.
            if bar.done < last.done:
                self._before_bar += last.total
        self._bar = bar
        if self._before_bar == 0:
            self.total_steps = bar.total  # one bar for the run, as far as it has shown
        return self._before_bar + bar.done

    def _placed_by_bar(self, step: int) -> None:
        if self.counted:
            # Losses kept in order before any bar counted them (a capture's scrollback of
            # HF Trainer's dicts above its bar): that bar says where they were.
            self._unplaced = [loss for _, loss in self.curve] + self._unplaced
            self.curve.clear()
            self.counted = False
        self._place(step)
        if self._eval_unplaced is not None and not self._screen and not (self._new_epoch and self._bar.done > 0):
            # A new epoch's bar first drawn past its start says nothing of the step the
            # evaluation before it was made at: trainers date it at the last epoch's end or
            # at the next step (ignite's first draw of an epoch is at its first iteration).
            _point(self.eval_curve, step, self._eval_unplaced)
        self._eval_unplaced = None
        if not self._named:
            self._advance(step)

    def _advance(self, step: int) -> None:
        if self.step is None or step >= self.step or (self._named and self.curve and self.curve[-1][0] == step):
            self.step = step

    def _place(self, end: int | None) -> None:
        """Give the waiting losses steps: every so many up to `end`, when they divide the
        steps since the last point evenly (a trainer logs every N steps; HF Trainer's last
        log may fall off that pace, and then nothing is guessed); with no bar or step ever,
        one each after the last point (`counted`)."""
        if not self._unplaced:
            return
        start = self.curve[-1][0] if self.curve else 0
        count = len(self._unplaced)
        if end is None:
            if self._bar is not None or self._named:
                return  # the next bar tells
            self.counted = True
            steps = list(range(start + 1, start + count + 1))
        elif end > start and (end - start) % count == 0:
            steps = [start + (i + 1) * (end - start) // count for i in range(count)]
        else:
            self._unplaced.clear()  # their steps are not known: the latest loss is still shown
            return
        for step, loss in zip(steps, self._unplaced):
            _point(self.curve, step, loss)
        self._unplaced.clear()
        if not self.counted and not self._named:
            self._advance(steps[-1])


def _point(curve: deque, step: int, value: float, *, restart: bool = False) -> None:
    """Add a point; a step shown again is drawn over (a bar redrawn with its loss updated).
    A step before the last one is a bar set back (Lightning's, before its next epoch's
    label): ignored, unless the line named it (`restart`: a resumed run counts again from
    its checkpoint, and the series with it)."""
    if curve and step < curve[-1][0] and not restart:
        return
    while curve and curve[-1][0] >= step:
        curve.pop()
    curve.append((step, value))


def summarize(lines: Iterable[str]) -> ConsoleSummary:
    """A whole capture, folded."""
    summary = ConsoleSummary()
    summary.add(lines)
    summary.settle()
    return summary
