"""The dashboard's command moved to tui/commands/dashboard.py; this name stays while
tui/serve/app.py and tests/tui/test_bad_input.py import it from here."""

from tui.commands.dashboard import dashboard, main  # noqa: F401
