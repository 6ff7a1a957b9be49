"""Random keys as an operator might press them: the pool, the pauses, and the answers to
dialogs (always No: a monkey must never stop or duplicate the run it is typing at)."""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass, field

from textual.app import App
from textual.binding import Binding

from tui.app import TracksideApp
from tui.screens.alerts import AlertsScreen
from tui.screens.confirm import Confirm
from tui.screens.edit import EditScreen
from tui.screens.fleet import FleetScreen
from tui.screens.help import HelpScreen
from tui.screens.kill import KillConfirm, KillReportScreen
from tui.screens.pick_run import PickRun
from tui.screens.run import RunScreen

SCREENS = [TracksideApp, App, FleetScreen, RunScreen, EditScreen, KillConfirm, KillReportScreen, PickRun, Confirm, HelpScreen, AlertsScreen]
MOVES = ["enter", "escape", "up", "down", "left", "right", "tab", "shift+tab", "home", "end", "pageup", "pagedown"]
TYPED = list("0123456789abcdefghijklmnoprstuvwxyz .-_=")  # no q: it quits outside an input
# Keys that answer Yes in a dialog: pressed only where no dialog can be on its way.
ANSWERS_YES = {"y"}
# Keys that may open a kill or relaunch dialog: the monkey waits to see whether one came
# before its next key, or queued keys (tab, enter) could answer it Yes.
OPENS_DIALOG = {"k", "R", "r"}
MOVES_FOCUS = {"tab", "shift+tab", "left", "right"}
# The command palette: the monkey waits for it to open, then types into it anything but
# Enter (which would run whatever command is highlighted: Quit among them).
OPENS_PALETTE = {App.COMMAND_PALETTE_BINDING}
# What the tmux monkey reads the open palette by: its search icon (textual.command.SearchIcon),
# there while it is open. Its placeholder, "Search for commands…", goes at the first key
# typed: read by that, a palette with "q" typed looked closed, and the next Enter ran Quit.
PALETTE_OPEN = "🔎"
# Words only a dialog or the palette shows: the tmux monkey, reading the pane, knows by
# them that one is up (the kill plan, the relaunch question, the palette, the edit form,
# the help and alerts lists, the overlay picker, a kill's report).
DIALOG_MARKERS = ("Stop run", "Relaunch while", PALETTE_OPEN, "relaunch applies these", "Keep (r relaunches)",
                  "Esc or ? closes", "Esc or ! closes", "Draw which run's loss")  # fmt: skip
# What a key types, for the keys Textual names by word.
CHARACTERS = {"slash": "/", "question_mark": "?", "space": " "}


def character(key: str) -> str | None:
    return CHARACTERS.get(key, key if len(key) == 1 else None)


def binding_keys() -> set[str]:
    """Every key bound on every screen of the dashboard, but the ones that quit."""
    keys = set()
    for owner in SCREENS:
        for binding in owner.BINDINGS:
            if isinstance(binding, Binding) and binding.action not in ("quit",):
                keys.update(k.strip() for k in binding.key.split(","))
    return keys | {App.COMMAND_PALETTE_BINDING}  # bound by Textual at start-up


def pool() -> list[str]:
    # Bindings weigh about as much as all the rest together: they are what can break
    # things. The dialog keys come less often: each waits for its dialog (a process
    # listing on the host), which is most of what a key costs the test.
    keys = sorted(binding_keys() - OPENS_DIALOG)
    return keys * 3 + sorted(OPENS_DIALOG) + MOVES * 2 + TYPED


def in_palette(rng: random.Random, keys: list[str]) -> str:
    """A key typed into the open palette: never Enter; often enough Escape that the palette
    gets a few keys, not most of the run."""
    return "escape" if rng.random() < 0.3 else rng.choice([k for k in keys if k != "enter"])


# Terminal sizes the monkeys resize to now and then, as an operator splits a tmux pane or
# drags a window: under Pilot down to a few cells; in tmux no smaller than a dialog's text
# (the tmux monkey reads dialogs off the pane to answer them No).
PILOT_SIZES = [(12, 4), (40, 12), (80, 24), (120, 40), (160, 48), (220, 60)]
TMUX_SIZES = [(80, 24), (120, 40), (160, 48), (200, 60)]


def resize_to(rng: random.Random, sizes: list[tuple[int, int]]) -> tuple[int, int] | None:
    """A size to resize to before the next key, about one key in fifty."""
    return rng.choice(sizes) if rng.random() < 0.02 else None


def presses(rng: random.Random, key: str) -> int:
    """How many times the key goes out back to back: now and then twice, as a double press
    or a key's repeat arrives (keys that answer dialogs or type text, once)."""
    return 2 if key not in ANSWERS_YES and rng.random() < 0.05 else 1


def seed_from_env() -> int:
    return int(os.environ.get("TRACKSIDE_MONKEY_SEED") or time.time_ns() % 2**32)


def pause_s(rng: random.Random) -> float:
    """0-300 ms, most of them short: a person's bursts with the odd hesitation."""
    roll = rng.random()
    if roll < 0.75:
        return 0.0
    if roll < 0.93:
        return rng.uniform(0.0, 0.03)
    return rng.uniform(0.03, 0.3)


@dataclass
class Tally:
    seed: int
    keys: int = 0
    dialogs_answered_no: int = 0
    resizes: int = 0
    doubles: int = 0  # keys sent twice back to back
    screens: dict[str, int] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)

    def line(self, what: str) -> str:
        seen = ", ".join(f"{name} {n}" for name, n in sorted(self.screens.items()))
        return (
            f"{what}: seed={self.seed} keys={self.keys} duration={time.monotonic() - self.started:.1f}s "
            f"dialogs answered No={self.dialogs_answered_no} resizes={self.resizes} doubles={self.doubles}"
            + (f"; screens seen: {seen}" if seen else "")
        )
