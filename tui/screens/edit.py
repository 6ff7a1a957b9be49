"""Edit a run's launch parameters: typed and validated, shown as a diff, with their cost."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical, VerticalScroll
from textual.timer import Timer
from textual.widgets import Button, Input, Label, Static
from textual.worker import Worker, WorkerState

from backends import params as run_params
from tui.inert import inert
from tui.predict import Basis, no_memory_model
from tui.state import HostState, RunState, format_duration, format_number
from tui.screens.dialog import Dialog

FIELDS = ["max_seq_len", "ttt_steps", "lr", "steps", "batch_rows", "epochs", "ttt_decay", "loss_chunk",
          "checkpoint_ttt", "freeze_lm_head", "fp8"]
# A DFlash run's: its trainer refuses EAGLE-3's TTT flags.
DFLASH_FIELDS = ["max_seq_len", "block_size", "max_anchors", "dflash_gamma", "soft_kl", "lr", "steps",
                 "batch_rows", "epochs", "loss_chunk", "fp8"]
# The cost is predicted once typing pauses this long, in a worker thread: keys never wait
# for it, and a burst of them asks for one prediction.
PREDICT_AFTER_S = 0.15


def gpu_total_gib(host: HostState) -> float | None:
    totals = [r.mem_total_mib for r in (host.gpus.gpus if host.gpus else ()) if r.mem_total_mib]
    return min(totals) / 1024 if totals else None


def shown(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"  # as the form's input reads it
    return "" if value is None else str(value)


class EditScreen(Dialog[dict | None]):
    """Dismisses with the changed params ({} for none) or None when cancelled."""

    BINDINGS = [
        Binding("escape", "cancel", "Cancel", id="trackside.edit.cancel"),
        Binding("ctrl+s", "keep", "Keep", id="trackside.edit.keep"),
    ]

    def __init__(self, run: RunState, host: HostState, pending: dict) -> None:
        super().__init__()
        self.run = run
        self.host = host
        self.pending = pending
        self.changes: dict = dict(pending)
        self.cost_asked = self.cost_shown = 0  # numbers the requests: only the latest is shown
        self.cost_timer: Timer | None = None
        self.fields = DFLASH_FIELDS if run.is_dflash else FIELDS

    def compose(self) -> ComposeResult:
        current = self.run.params
        with Vertical(classes="dialog", id="edit"):
            yield Static(inert(Text(f"Edit {self.run.key} — relaunch applies these (r)", style="bold")))
            # The fields and what they cost scroll between the title and the buttons, which a
            # short terminal (80×24) would otherwise push out of sight.
            with VerticalScroll(id="edit-body"):
                with Grid(id="edit-fields"):
                    for name in self.fields:
                        yield Label(name)
                        yield Input(
                            shown(self.pending.get(name, current.get(name))),
                            placeholder=f"{run_params.PARAMS[name].describe()} (unset: default)",
                            id=f"param-{name}",
                            compact=True,
                        )
                yield Static(id="edit-diff")
                yield Static(Text("predicting…", style="dim"), id="edit-cost")
            # Out of the scrolling body, over the buttons: a value's error, which is why
            # Keep is off, is in sight while it is typed, wherever its field is.
            yield Static(id="edit-errors")
            with Horizontal(classes="buttons"):
                yield Button("Cancel", id="cancel")
                yield Button("Keep (r relaunches)", id="keep", variant="primary")

    def on_mount(self) -> None:
        if self.taken_down():
            return
        self.query_one("#param-max_seq_len", Input).focus()
        self.validate()
        self.ask_cost()

    def on_input_changed(self, event: Input.Changed) -> None:
        self.validate()
        self.ask_cost()

    def ask_cost(self) -> None:
        """Predict the cost of the edit as it stands once typing pauses."""
        self.cost_asked += 1
        if self.cost_timer is not None:
            self.cost_timer.stop()
        self.cost_timer = self.set_timer(PREDICT_AFTER_S, self._predict_cost)

    def _predict_cost(self) -> None:
        # What the worker reads is copied here, on the UI thread, which alone changes it.
        # A cleared parameter goes back to the trainer's default, which is not known here:
        # the prediction keeps the run's value for it.
        asked, basis = self.cost_asked, Basis.of(self.run)
        changes = {k: v for k, v in self.changes.items() if v is not None}
        total = gpu_total_gib(self.host)
        self.run_worker(
            lambda: (asked, cost_text(basis, changes, total)), group="cost", thread=True, exit_on_error=False
        )

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.worker.group != "cost" or event.state is not WorkerState.SUCCESS:
            return
        asked, text = event.worker.result
        if asked == self.cost_asked:  # an answer to an older edit is dropped
            self.query_one("#edit-cost", Static).update(text)
            self.cost_shown = asked

    @property
    def cost_is_current(self) -> bool:
        """Whether the cost shown is the edit's as it stands (what a test or script waits for)."""
        return self.cost_shown == self.cost_asked

    def validate(self) -> bool:
        current = self.run.params
        changes, errors = {}, []
        for name in self.fields:
            text = self.query_one(f"#param-{name}", Input).value.strip()
            if not text and name in self.run.info.params:
                changes[name] = None  # cleared: the relaunch leaves the flag out, the trainer's default
                continue
            if not text or text == shown(current.get(name)):
                continue
            try:
                value = run_params.parse_sets([f"{name}={text}"])[name]
            except run_params.ParamError as error:
                errors.append(str(error))
                continue
            if value != current.get(name):
                changes[name] = value
        if not errors:
            drafter = "dflash" if self.run.is_dflash else "eagle3"
            errors = [str(error) for error in run_params.conflicts(self.relaunched(changes), drafter)]
        self.changes = changes
        shown_errors = self.query_one("#edit-errors", Static)
        shown_errors.update(inert(Text("\n".join(errors), style="bold red")))
        shown_errors.display = bool(errors)
        self.query_one("#edit-diff", Static).update(inert(self.diff_text()))  # a manifest's values are anyone's
        self.query_one("#keep", Button).disabled = bool(errors)
        return not errors

    def relaunched(self, changes: dict) -> dict:
        """What the relaunch will train with, as far as run_params.conflicts asks: the row
        length and block size its start event resolved, the params its argv carries (a
        preset's anchors left out of it are the trainer's to fit), the changes."""
        config = self.run.metrics.config
        resolved = {"max_seq_len": config.get("max_seq_len"), "block_size": self.run.params.get("block_size")}
        return {**{k: v for k, v in resolved.items() if v is not None}, **self.run.info.params, **changes}

    def diff_text(self) -> Text:
        if not self.changes:
            return Text("no change", style="dim")
        text = Text()
        for name, value in self.changes.items():
            text.append(f"{name}: ")
            text.append(shown(self.run.params.get(name)) or "default", style="red")
            text.append(" → ")
            text.append(f"{shown(value) if value is not None else 'default (cleared)'}\n", style="green")
        return text

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "keep":
            self.action_keep()
        else:
            self.action_cancel()

    def action_keep(self) -> None:
        if self.validate():
            self.dismiss(self.changes)

    def action_cancel(self) -> None:
        self.dismiss(None)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.action_keep()


def cost_text(basis: Basis, changes: dict, gpu_total: float | None) -> Text:
    """The edit's cost against the run's own: steps, epoch time, peak memory and fit."""
    now, new = basis.predict({}), basis.predict(changes, gpu_total)
    params = {**basis.params, **changes}
    text = Text()
    text.append("steps per epoch  ")
    text.append(f"{format_number(basis.steps_per_epoch)} → ≈{format_number(new.steps_per_epoch)}\n")
    text.append("epoch time       ")
    text.append(f"{format_duration(now.epoch_s)} → ≈{format_duration(new.epoch_s)}\n")
    text.append("peak memory      ")
    if new.peak_gib is None:
        text.append(f"—  ({no_memory_model(basis, params)})\n", style="dim")
        return text
    # A DFlash run's params always hold its block size (its start event's), an EAGLE-3 run's never.
    depth = f"block_size {params['block_size']}" if "block_size" in params else f"ttt_steps {params.get('ttt_steps')}"
    length, largest = params.get("max_seq_len"), new.largest_max_seq_len
    anchors, most_anchors = params.get("max_anchors"), new.largest_max_anchors
    fits = gpu_total is None or largest is None or length is None or length <= largest
    fits = fits and (gpu_total is None or most_anchors is None or anchors is None or anchors <= most_anchors)
    text.append(f"≈{new.peak_gib:.1f} GiB", style="green" if fits else "bold red")
    text.append(f" of {gpu_total:.0f} GiB per GPU" if gpu_total else " (no GPU reading)")
    text.append("" if fits else "  — will not fit", style="bold red")
    fewest = new.fewest_checkpoint_ttt
    if not fits and fewest and fewest != params.get("checkpoint_ttt"):
        text.append(f"\nfits with checkpoint_ttt {fewest}", style="bold")
        text.append(f" (the first {fewest} TTT steps recomputed in backward)")
    if new.largest_max_seq_len:
        text.append(f"\nlargest max_seq_len that fits at {depth}: ")
        text.append(f"{new.largest_max_seq_len}", style="bold")
    if most_anchors:
        text.append(f"\nlargest max_anchors that fits at {depth}{f', max_seq_len {length}' if length else ''}: ")
        text.append(f"{most_anchors}", style="bold")
    return text
