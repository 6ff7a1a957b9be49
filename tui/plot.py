"""`trackside plot` moved to tui/commands/plot.py; this name stays while
scripts/screenshots.py imports it from here."""

from tui.commands.plot import main  # noqa: F401
