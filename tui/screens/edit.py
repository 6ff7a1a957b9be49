"""Edit a run's launch parameters: typed and validated, shown as a diff, with their cost."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

from backends import params as run_params
from tui.predict import predict
from tui.state import HostState, RunState, format_duration, format_number
from tui.guard import Guarded

FIELDS = ["max_seq_len", "ttt_steps", "lr", "steps", "batch_rows", "epochs", "ttt_decay", "loss_chunk",
          "checkpoint_ttt", "freeze_lm_head"]


def gpu_total_gib(host: HostState) -> float | None:
    totals = [r.mem_total_mib for r in getattr(host.gpus, "gpus", None) or [] if r.mem_total_mib]
    return min(totals) / 1024 if totals else None


def shown(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"  # as the form's input reads it
    return "" if value is None else str(value)


class EditScreen(Guarded, ModalScreen[dict | None]):
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

    def compose(self) -> ComposeResult:
        current = self.run.params
        with Vertical(classes="dialog", id="edit"):
            yield Static(Text(f"Edit {self.run.key} — relaunch applies these (r)", style="bold"))
            with Grid(id="edit-fields"):
                for name in FIELDS:
                    yield Label(name)
                    yield Input(
                        shown(self.pending.get(name, current.get(name))),
                        placeholder=f"{run_params.PARAMS[name].describe()} (unset: default)",
                        id=f"param-{name}",
                        compact=True,
                    )
            yield Static(id="edit-errors")
            yield Static(id="edit-diff")
            yield Static(id="edit-cost")
            with Horizontal(classes="buttons"):
                yield Button("Cancel", id="cancel")
                yield Button("Keep (r relaunches)", id="keep", variant="primary")

    def on_mount(self) -> None:
        self.query_one("#param-max_seq_len", Input).focus()
        self.validate()

    def on_input_changed(self, event: Input.Changed) -> None:
        self.validate()

    def validate(self) -> bool:
        current = self.run.params
        changes, errors = {}, []
        for name in FIELDS:
            text = self.query_one(f"#param-{name}", Input).value.strip()
            if not text or text == shown(current.get(name)):
                continue
            try:
                value = run_params.parse_sets([f"{name}={text}"])[name]
            except run_params.ParamError as error:
                errors.append(str(error))
                continue
            if value != current.get(name):
                changes[name] = value
        self.changes = changes
        self.query_one("#edit-errors", Static).update(Text("\n".join(errors), style="bold red"))
        self.query_one("#edit-diff", Static).update(self.diff_text())
        self.query_one("#edit-cost", Static).update(self.cost_text())
        self.query_one("#keep", Button).disabled = bool(errors)
        return not errors

    def diff_text(self) -> Text:
        if not self.changes:
            return Text("no change", style="dim")
        text = Text()
        for name, value in self.changes.items():
            text.append(f"{name}: ")
            text.append(shown(self.run.params.get(name)) or "default", style="red")
            text.append(" → ")
            text.append(f"{shown(value)}\n", style="green")
        return text

    def cost_text(self) -> Text:
        total = gpu_total_gib(self.host)
        now = predict(self.run, {})
        new = predict(self.run, self.changes, total)
        text = Text()
        text.append("steps per epoch  ")
        text.append(f"{format_number(self.run.steps_per_epoch)} → ≈{format_number(new.steps_per_epoch)}\n")
        text.append("epoch time       ")
        text.append(f"{format_duration(now.epoch_s)} → ≈{format_duration(new.epoch_s)}\n")
        text.append("peak memory      ")
        if new.peak_gib is None:
            text.append("—  (no memory model for this run yet)\n", style="dim")
            return text
        length, largest = self.new_params.get("max_seq_len"), new.largest_max_seq_len
        fits = total is None or largest is None or length is None or length <= largest
        text.append(f"≈{new.peak_gib:.1f} GiB", style="green" if fits else "bold red")
        text.append(f" of {total:.0f} GiB per GPU" if total else " (no GPU reading)")
        text.append("" if fits else "  — will not fit", style="bold red")
        fewest = new.fewest_checkpoint_ttt
        if not fits and fewest and fewest != self.new_params.get("checkpoint_ttt"):
            text.append(f"\nfits with checkpoint_ttt {fewest}", style="bold")
            text.append(f" (the first {fewest} TTT steps recomputed in backward)")
        if new.largest_max_seq_len:
            text.append(f"\nlargest max_seq_len that fits at ttt_steps {self.new_params.get('ttt_steps')}: ")
            text.append(f"{new.largest_max_seq_len}", style="bold")
        return text

    @property
    def new_params(self) -> dict:
        return {**self.run.params, **self.changes}

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
