"""Every key of the dashboard, in one table: Footer, `?` help and the command palette read it.

Ids let a user's keymap rebind a key without touching the code.
"""

from textual.binding import Binding

# Actions that act on the selected run; the app disables them where no run is selected.
RUN_ACTIONS = {"kill", "edit", "relaunch", "kill_relaunch", "attach"}

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
