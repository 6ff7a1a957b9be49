"""The screens offer the app what their Protocols say, and the app checks those types
instead of probing for names."""

from __future__ import annotations

import re
from pathlib import Path

from tui.protocols import Filters, FocusesLog, SelectsRun, ShowsState
from tui.screens.fleet import FleetScreen
from tui.screens.help import HelpScreen
from tui.screens.run import RunScreen

TUI = Path(__file__).resolve().parents[2] / "tui"
# Probes by name left, each with its reason: textual_compat reaches Textual's private
# names by definition; tui/monitor.py (a snapshot that may be None) is not yet typed;
# tui/guard.py asks a function whether functools.wraps already wrapped it.
PROBES_LEFT = {"textual_compat.py": 4, "guard.py": 1, "monitor.py": 1}


def test_each_screen_offers_what_its_type_says():
    fleet, run, help_ = FleetScreen(), RunScreen("h200-box/r"), HelpScreen(FleetScreen())
    assert isinstance(fleet, SelectsRun) and isinstance(fleet, ShowsState) and isinstance(fleet, Filters)
    assert not isinstance(fleet, FocusesLog)
    assert all(isinstance(run, offer) for offer in (SelectsRun, ShowsState, Filters, FocusesLog))
    assert not any(isinstance(help_, offer) for offer in (SelectsRun, ShowsState, Filters, FocusesLog))


def test_no_screen_is_probed_by_name():
    probes = {}
    for path in TUI.rglob("*.py"):
        count = len(re.findall(r"\b(?:hasattr|getattr)\(", path.read_text(encoding="utf-8")))
        if count:
            probes[str(path.relative_to(TUI))] = count
    assert probes == PROBES_LEFT
