"""How a new alert reaches an operator who looked away from the dashboard: the terminal's
bell, and a desktop notification escape written to the terminal the app runs in.

Two escapes, as terminals differ: OSC 9 (iTerm2, Windows Terminal, WezTerm, kitty, foot)
and OSC 777 `notify` (VTE terminals, rxvt, Ghostty). A terminal that knows neither
ignores both. The rules themselves live in backends.alerts.
"""

from __future__ import annotations

import re

from backends.alerts import Alert
from tui.textual_compat import write_to_terminal

TITLE = "trackside"
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def notification_escapes(alert: Alert) -> str:
    # Control characters would end the escape early (BEL, ESC) or start another; the
    # title prefix keeps OSC 9 from reading a text that starts "4;" as a progress report.
    text = _CONTROL.sub(" ", f"{TITLE}: {alert.text}")
    return f"\x1b]9;{text}\x07\x1b]777;notify;{TITLE};{text}\x07"


def announce(app, alert: Alert) -> None:
    """The bell, then the notification escapes, through the app's own terminal driver."""
    app.bell()
    if app.is_headless:
        return
    # A Textual without a driver to write to loses the notification, not the dashboard.
    write_to_terminal(app, notification_escapes(alert))
