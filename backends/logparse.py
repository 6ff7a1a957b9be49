"""Reading training logs: metrics.jsonl events, loss from any trainer's console, progress bars.

Every function here is pure and total: any string in, a value or None out, never an exception,
because a garbled line must never take the dashboard down.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

# Terminal escapes tqdm and colour loggers write (cursor moves, colours).
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-_]")


def visible_text(line: str) -> str:
    """What a terminal would leave on screen: the last carriage-return segment, no escapes.

    tqdm redraws a bar in place with \\r, so a captured pane line holds every redraw; the last
    one is the newest.
    """
    segments = [s for s in _ANSI.sub("", line).split("\r") if s.strip()]
    return segments[-1].rstrip("\n") if segments else ""


# Where a terminal starts drawing over what it drew: a carriage return, or a cursor moved
# up (Rich's live bars redraw their lines from the top).
_REDRAW = re.compile(r"\r|\x1b\[[0-9]*[AF]")


def redraws(line: str) -> list[str]:
    """Every state a recorded line was drawn in, oldest first, as visible text: a tqdm or
    Rich bar redrawn in place a hundred times is a hundred states, each a step shown."""
    states = (_ANSI.sub("", part).rstrip() for part in _REDRAW.split(line))
    return [state for state in states if state.strip()]


def parse_metrics_line(line: str) -> dict | None:
    """One metrics.jsonl line → its event object, or None if it is not one."""
    try:
        event = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(event, dict) or not isinstance(event.get("event"), str):
        return None
    return event


_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf(?:inity)?)"
# `key=value`, `key: value`, `'key': value` (Python dicts), `key value`; a value must end
# where a field ends, so `4.98it/s`, `1/3` and `12:30` are not read as numbers, but may be
# followed by a colon that ends a field (nanoGPT's `iter 100: loss 2.3`).
_PAIR = re.compile(
    rf"""(?<![\w./-])['"]?(?P<key>[A-Za-z_][\w./-]{{0,63}})['"]?"""
    rf"""(?P<sep>[ \t]*[=:][ \t]*|[ \t]+)(?P<value>{_NUMBER})(?=$|[\s,;}})\]|]|:(?:\s|$))""",
    re.IGNORECASE,
)
# Keys believed when only a space separates them from their value (`loss 1.23`, `step 12`):
# prose is full of "word number" pairs that are not metrics.
_SPACED_KEYS = re.compile(r".*loss|step|epoch|iter|iteration|lr|grad_norm", re.IGNORECASE)
# Longer integers are read as floats: int() refuses strings of over 4,300 digits, and no
# step or loss has 19.
_INTEGER = re.compile(r"[-+]?\d{1,18}")
# A loss key: `loss`, `train_loss`, `eval/loss`, or one per TTT step (speculators'
# `train/loss_0`, `train/loss_1`, ...).
_LOSS_KEY = re.compile(r".*loss(?:_\d+)?")
_EVAL_KEY = re.compile(r"eval|val|test")
# A line's own step counter; never `epoch`, which HF Trainer prints as a float.
STEP_KEYS = frozenset({"step", "global_step", "iter", "iteration"})


def _numeric(text: str) -> int | float:
    return int(text) if _INTEGER.fullmatch(text) else float(text)


def parse_console_line(line: str) -> dict[str, int | float] | None:
    """Numeric fields of a console line that reports a loss, or None.

    Reads `step=12 loss=1.23 lr=3e-4`, `{'loss': 1.2, 'grad_norm': 0.3, 'epoch': 0.5}`,
    `loss: 1.23`, `loss 1.23`, `Loss=1.2e-1`, tqdm postfixes (`…, loss=2.31, lr=1e-4]`),
    `iter 100: loss 2.3456` and JSON lines. Keys are lower-cased; a line without a loss key
    (`…loss`, or `…loss_<k>` per TTT step) is not a metrics line. When there is no plain
    `loss` the first training-side loss key (e.g. `train/loss`, `train/loss_0`) is also
    given as `loss`.
    """
    text = visible_text(line)
    if "loss" not in text.lower():  # most lines: skip the pairs' scan
        return None
    fields: dict[str, int | float] = {}
    for m in _PAIR.finditer(text):
        key = m["key"].lower()
        if m["sep"].strip() or _SPACED_KEYS.fullmatch(key):
            fields.setdefault(key, _numeric(m["value"]))
    losses = [k for k in fields if _LOSS_KEY.fullmatch(k)]
    if not losses:
        return None
    if "loss" not in fields:
        train = [k for k in losses if not _EVAL_KEY.search(k)]
        if train:
            fields["loss"] = fields[train[0]]
    return fields


def step_of(fields: dict[str, int | float]) -> int | None:
    """The step a metrics line names (`step`, `global_step`, `iter`, `train/step`, ...), if
    it is a whole number: a float there is some other counter's."""
    for key, value in fields.items():
        if key.rsplit("/", 1)[-1] in STEP_KEYS and isinstance(value, int) and value >= 0:
            return value
    return None


@dataclass(frozen=True)
class Progress:
    phase: str  # loading / extracting / compiling / training, or "working" when unknown
    done: int
    total: int
    eta_s: float | None
    label: str = ""  # the bar's own description, e.g. "Loading checkpoint shards"

    @property
    def fraction(self) -> float:
        return self.done / self.total if self.total else 0.0


_PHASES = (
    ("loading", re.compile(r"load|shards?\b|safetensors|from_pretrained|download", re.IGNORECASE)),
    ("extracting", re.compile(r"extract|hidden.?states?|captur", re.IGNORECASE)),
    ("compiling", re.compile(r"compil|autotun|inductor|triton", re.IGNORECASE)),
    ("training", re.compile(r"train|epoch|\bstep|loss", re.IGNORECASE)),
)


def phase_of(line: str) -> str | None:
    """What a log line says the job is doing: loading, extracting, compiling or training."""
    text = visible_text(line)
    return next((name for name, pattern in _PHASES if pattern.search(text)), None)


# Counts are bounded to 18 digits (see _INTEGER), clocks to 12 characters.
# tqdm: `desc: 50%|█████     | 32/64 [01:02<01:02, 1.95s/it, loss=2.31]`
_TQDM = re.compile(r"(\d{1,3})%\|[^|\n]{0,200}\|\s*(\d{1,18})/(\d{1,18})(?!\d)(?:\s*\[([\d:]{1,12})<([\d:]{1,12}|\?))?")
# Bar-less counters: `Loading safetensors checkpoint shards: 12/64`, `Step 120/5000 | loss …`
_COUNTER = re.compile(
    r"([A-Za-z][^:\n]{0,120}):\s*(\d{1,18})/(\d{1,18})(?![\d/])|\b(step|iter(?:ation)?)\s+(\d{1,18})/(\d{1,18})(?![\d/])",
    re.IGNORECASE,
)


def _seconds(clock: str | None) -> float | None:
    """tqdm's `[H:]MM:SS` → seconds; None for `?` or anything else."""
    parts = (clock or "").split(":")
    if not 2 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        return None
    seconds = 0
    for part in parts:
        seconds = seconds * 60 + int(part)
    return float(seconds)


def parse_progress(line: str) -> Progress | None:
    """A tqdm bar or an `N/M` counter line → Progress, or None."""
    text = visible_text(line)
    if m := _TQDM.search(text):
        label = text[: m.start()].strip().rstrip(":").strip()
        done, total, eta = int(m[2]), int(m[3]), _seconds(m[5])
    elif m := _COUNTER.search(text):
        label, done, total = (m[1], m[2], m[3]) if m[1] else (m[4], m[5], m[6])
        label, done, total, eta = label.strip(), int(done), int(total), None
    else:
        return None
    if total <= 0 or done > total:
        return None
    return Progress(phase_of(text) or "working", done, total, eta, label)
