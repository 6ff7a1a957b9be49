"""Reading training logs: metrics.jsonl events, loss from any trainer's console, progress bars.

Every function here is pure and total: any string in, a value or None out, never an exception,
because a garbled line must never take the dashboard down.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from backends import untrusted_json
from backends.logs.screen import visible_text


def parse_metrics_line(line: str) -> dict | None:
    """One metrics.jsonl line → its event object, or None if it is not one."""
    try:
        event = untrusted_json.loads(line)  # NaN and infinities read as absent
    except ValueError:
        return None
    if not isinstance(event, dict) or not isinstance(event.get("event"), str):
        return None
    return event


_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf(?:inity)?)"
# `key=value`, `key: value`, `'key': value` or `'key': 'value'` (Python dicts; transformers
# 5 quotes its values), `key value`; a value must end where a field ends, so `4.98it/s`,
# `1/3` and `12:30` are not read as numbers, but may be followed by a colon that ends a
# field (nanoGPT's `iter 100: loss 2.3`). A loss key may carry its qualifier before a space
# (nanoGPT's `val loss`, Megatron's `lm loss`, the tutorials' `Average loss`) and `value`
# after it (Megatron's `lm loss value: 2.3`): read as `val_loss`, `lm_loss`, `average_loss`.
_PAIR = re.compile(
    rf"""(?<![\w./-])(?:(?P<qual>train|training|val|valid|validation|eval|test|lm|avg|average)[ \t]+(?=loss))?"""
    rf"""['"]?(?P<key>[A-Za-z_][\w./-]{{0,63}})['"]?(?:[ \t]+value(?=[ \t]*:))?"""
    rf"""(?P<sep>[ \t]*[=:][ \t]*|[ \t]+)(?P<quote>['"]?)(?P<value>{_NUMBER})(?P=quote)(?=$|[\s,;}})\]|]|:(?:\s|$))""",
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
_LOSS_KEY = re.compile(r".*loss(?:_\d+)?(?:_(?:epoch|step))?")
# One of several (a TTT step's `loss_1`, speculators' `val/loss_0_epoch`): the plain one
# beside them is the run's.
_PART_KEY = re.compile(r".*loss_\d+(?:_(?:epoch|step))?")
# An evaluation's loss: by its key (`eval_loss`, `val/loss`, `test_loss`), or every loss of
# a line that says it is a validation (torchtitan's `validate step:`, Megatron's
# `validation loss at iteration`, `Validation:`).
_EVAL_KEY = re.compile(r"(?:^|[_/.\-])(?:eval|val|valid|validation|test)(?:$|[_/.\-])", re.IGNORECASE)
_EVAL_LINE = re.compile(r"\b(?:validat\w*|evaluat\w*|eval|test)\b", re.IGNORECASE)
# A loss averaged over a set (`Test set: Average loss: 0.05`, ignite's `Avg loss`): an
# evaluation's on an evaluation's line, never a training step's.
_AVERAGE_KEY = re.compile(r"(?:avg|average)_")
# A training loss named as such, beside which an evaluation's report also gives its own
# (nanoGPT's `step N: train loss X, val loss Y`: both are estimates made at evaluation).
_TRAIN_KEY = re.compile(r"train(?:ing)?_")
# The run's loss among several a line names, by name: `step=10 aux_loss=0.01 lm_loss=2.3`
# is an lm_loss of 2.3, not an auxiliary 0.01.
_MAIN_LOSSES = ("loss", "train_loss", "train/loss", "lm_loss", "train/lm_loss", "total_loss", "train/total_loss")
# A line's own step counter; never `epoch`, which HF Trainer prints as a float.
STEP_KEYS = frozenset({"step", "steps", "global_step", "iter", "iteration"})  # DeepSpeed's pipeline engine prints `steps: N loss: X`
_OPTIMIZER_STEPS = frozenset({"step", "steps", "global_step"})  # first where a line names an iteration too

def _uncut(text: str) -> str:
    """A tqdm bar's postfix cut at the terminal's width (`…, val_loss=0.27` of 0.2734): its
    last value has no `,` or `]` after it, so it is left unread."""
    bar = _TQDM.search(text)
    opened = -1 if bar is None else text.find("[", bar.end(3))
    if opened < 0 or "]" in text[opened:]:
        return text
    comma = text.rfind(",", opened)
    return text if comma < 0 else text[:comma]


def _numeric(text: str) -> int | float:
    return int(text) if _INTEGER.fullmatch(text) else float(text)


def is_eval_key(key: str) -> bool:
    return bool(_EVAL_KEY.search(key))


def _is_bar(text: str) -> bool:
    return bool(_TQDM.search(text) or _KERAS.search(text) or _RICH.search(text) or _IGNITE.search(text))


def parse_console_line(line: str) -> dict[str, int | float] | None:
    """Numeric fields of a console line that reports a loss, or None.

    Reads `step=12 loss=1.23 lr=3e-4`, `{'loss': 1.2, 'grad_norm': 0.3, 'epoch': 0.5}`,
    `{'loss': '1.2'}`, `loss: 1.23`, `loss 1.23`, `Loss=1.2e-1`, tqdm postfixes (`…,
    loss=2.31, lr=1e-4]`), `iter 100: loss 2.3456`, `lm loss: 2.3` and JSON lines. Keys are
    lower-cased; a line without a loss key (`…loss`, or `…loss_<k>` per TTT step) is not a
    metrics line. The line's training loss is also given as `loss` (a plain `loss`, else
    the first loss key that is not an evaluation's: `train/loss`, `train/loss_0`,
    `lm_loss`), its evaluation loss as `eval_loss`; a line that says it is a validation
    gives only `eval_loss`, and so does an evaluation's report of both (`train loss X,
    val loss Y`).
    """
    text = visible_text(line)
    if "loss" not in text.lower():  # most lines: skip the pairs' scan
        return None
    text = _uncut(text)
    fields: dict[str, int | float] = {}
    spaced = set()  # `train loss`, `val loss`: a report's words, not a logger's keys
    for m in _PAIR.finditer(text):
        key = m["key"].lower()
        if m["qual"]:
            key = f"{m['qual'].lower()}_{key}"
            spaced.add(key)
        if m["sep"].strip() or _SPACED_KEYS.fullmatch(key):
            fields.setdefault(key, _numeric(m["value"]))
    losses = [k for k in fields if _LOSS_KEY.fullmatch(k)]
    if not losses:
        return None
    # A validation word before the first loss (`… INFO - validate step: 10  loss: …`).
    validation = bool(_EVAL_LINE.search(text, 0, text.lower().find("loss") + 1))
    whole = sorted(losses, key=lambda k: bool(_PART_KEY.fullmatch(k)))  # plain losses first
    evals = [k for k in whole if validation or is_eval_key(k)]
    train = [k for k in whole if k not in evals and not _AVERAGE_KEY.match(k)]
    if evals:
        fields["eval_loss"] = fields[evals[0]]
        if not validation and train and all(k in spaced and _TRAIN_KEY.match(k) for k in train) and not _is_bar(text):
            train = []  # an evaluation's report: its training loss is an estimate, not a step's
    whole_train = [k for k in train if not _PART_KEY.fullmatch(k)]
    main = next((k for k in _MAIN_LOSSES if k in train), None)
    if main is None and len(whole_train) == 1:
        main = whole_train[0]
    elif main is None and not whole_train and train:
        main = train[0]  # only per-step parts (speculators' loss_0, loss_1): the first stands for the run
    if main is not None:
        fields["loss"] = fields[main]
    else:
        fields.pop("loss", None)  # several losses, none of them the run's by name: shown as none
    return fields


def step_of(fields: dict[str, int | float]) -> int | None:
    """The step a metrics line names (`step`, `global_step`, `iter`, `train/step`, ...), if
    it is a whole number: a float there is some other counter's. A line naming both a step
    and an iteration counts optimizer steps by the step (litgpt's `iter 400 step 200` under
    gradient accumulation)."""
    named = [(key.rsplit("/", 1)[-1], value) for key, value in fields.items()]
    for keys in (_OPTIMIZER_STEPS, STEP_KEYS):
        for key, value in named:
            if key in keys and isinstance(value, int) and value >= 0:
                return value
    return None


@dataclass(frozen=True)
class Progress:
    phase: str  # loading / extracting / compiling / training, or "working" when unknown
    done: int
    total: int
    eta_s: float | None
    label: str = ""  # the bar's own description, e.g. "Loading checkpoint shards"
    # The bar's drawing: "tqdm", "rich" (Lightning's RichProgressBar), "keras", "ignite", or "counter"
    # (`Step 12/500`, Megatron's `iteration 12/ 500`).
    kind: str = "tqdm"
    epoch: int | None = None  # `Epoch E` or `Epoch E/M` in its label, as printed
    epochs: int | None = None  # the M of `Epoch E/M`
    epoch_from: int | None = None  # what its label counts epochs from, where its shape says (ignite's `Epoch [1/3]`)

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
# Rich (Lightning's RichProgressBar): `Epoch 0/2  ━━━━━━╺━━━━ 17/32 0:00:00 • 0:00:01 39.85it/s`
_RICH = re.compile(r"(\S[^━╸╺\n]{0,120}?)\s+[━╸╺╾╼]+\s+(\d{1,18})/(\d{1,18})(?!\d)(?:\s+[\d:]{1,12}\s+•\s+([\d:]{1,12}|-:--:--))?")
# Keras 3: ` 64/100 ━━━━━━━━━━━━ 7s 212ms/step - loss: 0.2080`, and its verbose=2 line at an
# epoch's end, `24/24 - 0s - 2ms/step - loss: 0.0768`
_KERAS = re.compile(r"^\s*(\d{1,18})/(\d{1,18})\s+(?:[━╸╺]+|-\s)")
# PyTorch-Ignite's ProgressBar: `Epoch [1/3]: [20/40]  50%|█████     , loss=2.29 [00:01<00:01]`
_IGNITE = re.compile(r"\[(\d{1,18})/(\d{1,18})\]\s{1,8}\d{1,3}%\|")
_IGNITE_CLOCK = re.compile(r"\[([\d:]{1,12})<([\d:]{1,12}|\?)\]\s*$")
# Bar-less counters: `Loading safetensors checkpoint shards: 12/64`, `Step 120/5000 | loss …`,
# Megatron's ` iteration       10/     100 |`
_COUNTER = re.compile(
    r"([A-Za-z][^:\n]{0,120}):\s*(\d{1,18})/(\d{1,18})(?![\d/])|\b(step|iter(?:ation)?)\s+(\d{1,18})/\s*(\d{1,18})(?![\d/])",
    re.IGNORECASE,
)
# An epoch in a bar's label: Lightning's `Epoch 3` (tqdm) and `Epoch 3/9` (Rich), ignite's
# `Epoch [1/3]` (from 1).
_EPOCH_LABEL = re.compile(r"\bepoch\s+(\[?)(\d{1,9})(?:\s*/\s*(\d{1,9}))?\b", re.IGNORECASE)


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
    """A tqdm, Rich or Keras bar, or an `N/M` counter line → Progress, or None."""
    text = visible_text(line)
    if m := _TQDM.search(text):
        label = text[: m.start()].strip().rstrip(":").strip()
        done, total, eta, kind = int(m[2]), int(m[3]), _seconds(m[5]), "tqdm"
    elif m := _KERAS.search(text):
        label, done, total, eta, kind = "", int(m[1]), int(m[2]), None, "keras"
    elif m := _IGNITE.search(text):
        clock = _IGNITE_CLOCK.search(text, m.end())
        label = text[: m.start()].strip().rstrip(":").strip()
        done, total, eta, kind = int(m[1]), int(m[2]), _seconds(clock[2] if clock else None), "ignite"
    elif m := _RICH.search(text):
        label, done, total, eta, kind = m[1].strip(), int(m[2]), int(m[3]), _seconds(m[4]), "rich"
    elif m := _COUNTER.search(text):
        label, done, total = (m[1], m[2], m[3]) if m[1] else (m[4], m[5], m[6])
        label, done, total, eta, kind = label.strip(), int(done), int(total), None, "counter"
        if m[1] and phase_of(label) is None:
            return None  # `Accuracy: 209/360`: a count of something, no job's progress
    else:
        return None
    if total <= 0 or done > total:
        return None
    epoch = _EPOCH_LABEL.search(label)
    return Progress(
        phase_of(text) or "working", done, total, eta, label, kind,
        int(epoch[2]) if epoch else None, int(epoch[3]) if epoch and epoch[3] else None,
        1 if epoch and epoch[1] else None,
    )  # fmt: skip
