"""Every key of the dashboard, in one table, and where each acts: Footer, `?` help and the
command palette read it. The keys are fixed: no configuration rebinds them.
"""

from __future__ import annotations

from collections.abc import Callable

from textual.binding import Binding

from backends import runs
from tui.protocols import Filters, FocusesLog, SelectsRun
from tui.state import RunState

# Actions that act on the selected run; the app disables them where no run is selected.
RUN_ACTIONS = {"kill", "edit", "relaunch", "kill_relaunch", "attach"}
# What a read-only dashboard (`trackside serve --read-only`) never offers: everything that
# changes a run, and attach, whose tmux session takes keystrokes into the run.
READ_ONLY_HIDDEN = {"kill", "kill_relaunch", "edit", "relaunch", "attach"}
# Actions a screen does itself, by what it offers.
SCREEN_ACTIONS = {"log_focus": FocusesLog, "filter": Filters}

KEYS = [
    Binding("k", "kill", "Kill", id="trackside.kill", tooltip="Stop the run's own processes, then verify its GPUs"),
    Binding("e", "edit", "Edit", id="trackside.edit", tooltip="Edit launch parameters (max_seq_len, TTT, …)"),
    Binding("r", "relaunch", "Relaunch", id="trackside.relaunch", tooltip="Relaunch with the edited parameters"),
    Binding("R", "kill_relaunch", "Kill+relaunch", id="trackside.kill_relaunch", key_display="R"),
    Binding("a", "attach", "Attach", id="trackside.attach", tooltip="Open the run's tmux session"),
    Binding("l", "log_focus", "Log", id="trackside.log"),
    Binding("slash", "filter", "Filter", id="trackside.filter", key_display="/"),
    # Not in the footer: the alert bar says what is up now; `?` and the palette tell the key.
    Binding("!", "alerts", "Alerts", id="trackside.alerts", show=False),
    Binding("question_mark", "help", "Help", id="trackside.help", key_display="?"),
    Binding("q", "quit", "Quit", id="trackside.quit"),
]

# What the command palette says for each action.
DESCRIPTIONS = {
    "kill": "Kill the selected run (its process tree only) and verify its GPU memory is released",
    "edit": "Edit the selected run's launch parameters",
    "relaunch": "Relaunch the selected run with the edited parameters",
    "kill_relaunch": "Kill the selected run and relaunch it with the edited parameters",
    "attach": "Open the selected run's tmux session (over SSH when remote)",
    "log_focus": "Focus the log tail",
    "filter": "Filter the rows or log lines",
    "alerts": "List every alert since the dashboard started, with when it was raised and cleared",
    "help": "Show the keys",
    "quit": "Quit trackside",
}

# The footer's keys by how long they stay where the footer is too narrow for all: the
# run's own actions, help (which lists every key) and quit outlast the rest; keys not
# named here (a screen's chart toggles) go first. Every key stays in `?` and the palette.
FOOTER_FIRST = ["kill", "edit", "relaunch", "kill_relaunch", "help", "quit", "back", "attach", "filter", "log_focus"]


def action_allowed(action: str, screen, selected_run: Callable[[object], RunState | None], *, read_only: bool) -> bool | None:
    """Whether a key of the app acts on `screen`: True, None (shown, disabled: the
    selection, `selected_run(screen)`, cannot take it) or False (hidden: nothing here to
    act on, or a read-only dashboard)."""
    if read_only and action in READ_ONLY_HIDDEN:
        return False
    if action in RUN_ACTIONS:
        if not isinstance(screen, SelectsRun):
            return False
        run = selected_run(screen)
        if run is None or refusal(action, run):
            return None  # shown disabled; pressed, it says why (the app's on_key)
    if action in SCREEN_ACTIONS:  # the screen's own, or the selected run's on its run screen
        return isinstance(screen, (SCREEN_ACTIONS[action], SelectsRun))
    return True


def refusal(action: str, run: RunState) -> str | None:
    """Why a run action cannot act on `run`, as the key says it; None where it can."""
    if action in ("kill", "kill_relaunch"):
        if run.info.this_dashboard:
            return f"{run.key} is the tmux session this dashboard runs in: it is never stopped from here"
        if run.info.state != runs.RunPhase.RUNNING and run.info.stop is None:  # a stop cut short: k finishes it
            return f"{run.key} has ended ({run.state_label}): nothing to stop"
    if action in ("edit", "relaunch", "kill_relaunch") and not run.info.run_id:
        return f"{run.key} was not launched by trackside: it has no launch record to edit or relaunch from"
    if action == "attach" and (run.gone or not run.info.session_open):
        return f"{run.key}'s tmux session {run.info.session} is gone: nothing to attach to"
    return None
