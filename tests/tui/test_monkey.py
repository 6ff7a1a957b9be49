"""Monkey tests: thousands of random keys at random pauses, now and then one pressed twice
back to back or a new terminal size, against the real dashboard over a live CPU training run, under Pilot and in a real
tmux pane. The app must stay alive and
drawing after every key, report no internal error, and never stop the run (every kill or
relaunch dialog is answered No).

TRACKSIDE_MONKEY_SEED replays a run; TRACKSIDE_MONKEY_KEYS / TRACKSIDE_MONKEY_TMUX_KEYS
change how many keys.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shlex
import subprocess
import sys
import time

import pytest
from textual import events
from textual.command import CommandPalette

from backends import params as run_params
from backends import runs
from tests.tui import monkey
from tests.tui.conftest import TRAIN, demo_run, screen_text, wait_for
from tests.waiting import HANG_S, trainer_started, until
from tui.app import Demo, TracksideApp, Watched
from tui.guard import RAISE_ERRORS_ENV
from tui.screens.confirm import Confirm
from tui.screens.kill import KillConfirm
from tui.screens.run import RunScreen

PARAMS = {"max_seq_len": 256, "ttt_steps": 2, "steps": 100000, "save_every": 100000}
DFLASH = [*TRAIN, "--drafter", "dflash", "--steps", "3", "--max-seq-len", "128", "--block-size", "4", "--max-anchors", "8"]
# The default screen, the fleet, a run, a dialog over it, the help or alerts list over
# that (from the palette), and the palette.
MAX_SCREENS = 6
PILOT_KEYS = int(os.environ.get("TRACKSIDE_MONKEY_KEYS", 2000))
TMUX_KEYS = int(os.environ.get("TRACKSIDE_MONKEY_TMUX_KEYS", 1500))


def background(pids: list[int]) -> None:
    """The run trains only so that the keys meet a live one: its process group gets the
    CPU the rest of the suite leaves (nice 19), not a core of its own for minutes."""
    for pid in pids:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PGRP, os.getpgid(pid), 19)


def _errors(app: TracksideApp) -> str:
    try:
        with open(app.error_log) as log:
            return log.read()[-4000:]
    except OSError:
        return ""


def _console_tail(run) -> str:
    try:
        with open(os.path.join(run.info.run_dir, "console.log"), errors="replace") as log:
            return "".join(log.readlines()[-15:])
    except (OSError, TypeError):
        return "(no console.log)"


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
async def test_random_keys_under_pilot_never_stop_the_dashboard(local_host, monkeypatch, record_property, size, tmp_path):
    monkeypatch.delenv("TMUX", raising=False)  # `a` must not reach the tmux this test runs in
    monkeypatch.chdir(tmp_path)  # the palette's Screenshot saves in the current directory
    tally = monkey.Tally(monkey.seed_from_env())
    rng = random.Random(tally.seed)
    keys = monkey.pool()
    demo = Demo(run_params.apply(TRAIN, PARAMS), "monkey-pilot", dict(PARAMS))
    # A short DFlash run beside the demo's EAGLE-3 one: its chart, stats and edit form
    # (other fields, other checks) are in reach of the keys too.
    await runs.launch(local_host, DFLASH, startup_s=0)
    # The dashboard's own mode: an error is survived and counted (asserted 0 after each key).
    app = TracksideApp([Watched(local_host, smi="nvidia-smi-absent")], demo=demo, grace_s=5, raise_errors=False)
    async with app.run_test(size=size) as pilot:
        screen = await wait_for(pilot, lambda: isinstance(app.screen, RunScreen) and app.screen.is_mounted and app.screen, 10, "the run screen")
        run = await demo_run(pilot, screen)
        await wait_for(pilot, lambda: trainer_started(run.info.run_dir), HANG_S, "the demo run's start event")
        await wait_for(pilot, lambda: run.steps, 90, "the run's first steps")
        background(run.info.pids)
        session = run.info.session
        def dialog_up() -> bool:
            return isinstance(app.screen, (KillConfirm, Confirm))

        def busy() -> bool:
            return any(w.group == "actions" and w.is_running for w in app.workers)

        recent: list[str] = []  # key@screen it was pressed on, for a failure's message
        try:
            while tally.keys < PILOT_KEYS:
                current = app.screen
                seen = type(current).__name__ + (" (DFlash)" if getattr(getattr(current, "run", None), "is_dflash", False) else "")
                tally.screens[seen] = tally.screens.get(seen, 0) + 1
                if dialog_up():
                    key = rng.choice(["n", "escape", "enter"])  # Enter presses the focused No
                    tally.dialogs_answered_no += 1
                elif isinstance(current, CommandPalette):
                    key = monkey.in_palette(rng, keys)
                else:
                    key = rng.choice(keys)
                    if key in monkey.ANSWERS_YES:
                        await pilot.pause()  # settled: no key of ours still queued
                        if dialog_up() or busy():
                            continue
                size = monkey.resize_to(rng, monkey.PILOT_SIZES)
                if size:
                    await pilot.resize_terminal(*size)
                    tally.resizes += 1
                # As a terminal delivers it: the app may still be busy with the last key.
                times = monkey.presses(rng, key) if not dialog_up() else 1
                tally.doubles += times - 1
                for _ in range(times):
                    app.post_message(events.Key(key, monkey.character(key)))
                    tally.keys += 1
                if key in monkey.OPENS_DIALOG:
                    await pilot.pause()
                    await wait_for(pilot, lambda: dialog_up() or not busy(), 30, f"{key!r}'s dialog or its end")
                elif key in monkey.OPENS_PALETTE:
                    await pilot.pause()
                else:
                    await asyncio.sleep(monkey.pause_s(rng))
                assert app.is_running and app.return_code is None and app.screen_stack, f"the app stopped after {key!r}"
                assert app.errors == 0, f"internal error after {key!r}:\n{_errors(app)}"
                # Screens stacked without end (each list opened over the last) grow until
                # drawing the modals, each over the one below, recursed past Python's limit.
                recent.append(f"{key}{'x2' if times > 1 else ''}@{type(current).__name__}")
                assert len(app.screen_stack) <= MAX_SCREENS, f"screens stacked up after {recent[-20:]}: {app.screen_stack}"
                # A screen pushed a moment ago may have had no layout yet: a few frames'
                # time for it (on a loaded machine one pause was not always enough).
                # One render a key (another only while nothing is drawn): rendering the whole
                # screen is most of what a key costs the monkey.
                drawn_by = time.monotonic() + 5
                while not (drawn := screen_text(app).strip()) and time.monotonic() < drawn_by:
                    await pilot.pause(0.05)
                assert drawn, f"nothing drawn after {key!r} on {app.screen_stack}"
        finally:
            survived = f"; failures of Textual's own workers survived: {app.textual_errors}"
            record_property("summary", tally.line("pilot monkey") + survived)
        await pilot.pause()  # the keys still queued, handled while the screens are there
        # What ended it, if anything did: the run as listed and its trainer's last words.
        ended = f"{run.info}\n{_console_tail(run)}"
        assert run.info.state.value == "running" and session in {r.info.session for r in app.runs.values()}, ended
        assert run.steps and run.steps[-1]["step"] > 1, "the run kept training under the keys"


def _tmux(socket: str, *args: str) -> str:
    return subprocess.run(["tmux", "-L", socket, *args], capture_output=True, text=True, check=True).stdout


# tmux send-keys names for the pool's Textual key names.
TMUX_NAMES = {
    "enter": "Enter", "escape": "Escape", "up": "Up", "down": "Down", "left": "Left", "right": "Right",
    "tab": "Tab", "shift+tab": "BTab", "home": "Home", "end": "End", "pageup": "PPage", "pagedown": "NPage",
    "slash": "/", "question_mark": "?", "space": "Space", "ctrl+p": "C-p", "ctrl+s": "C-s", "ctrl+c": "C-c",
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_random_keys_in_a_tmux_pane_never_stop_trackside_demo(tmp_path, tmux_socket, record_property):
    tally = monkey.Tally(monkey.seed_from_env())
    rng = random.Random(tally.seed)
    keys = [k for k in monkey.pool() if k not in ("ctrl+q",)]
    trackside = os.path.join(os.path.dirname(sys.executable), "trackside")
    done = tmp_path / "exit_status"
    # The dashboard's own mode, not the suite's (an error survived, as the operator meets it).
    env = f"TRACKSIDE_RUNS_ROOT={shlex.quote(str(tmp_path / 'runs'))} {RAISE_ERRORS_ENV}=0"
    # The pane's shell records how the dashboard ended; the pane stays to be read.
    command = f"{env} {shlex.quote(trackside)} demo; echo $? > {shlex.quote(str(done))}; sleep 600"
    # A terminal's default size, as most operators meet it; resized now and then below.
    # In a directory of its own: the palette's Screenshot saves in the current one.
    _tmux(tmux_socket, "new-session", "-d", "-s", "dash", "-x", "80", "-y", "24", "-c", str(tmp_path), command)

    def screen() -> str:
        return _tmux(tmux_socket, "capture-pane", "-p", "-t", "=dash:")

    def history() -> str:
        """The pane with what scrolled above it: how the app ended, when it did."""
        return _tmux(tmux_socket, "capture-pane", "-p", "-S", "-200", "-t", "=dash:")

    def alive() -> bool:
        return not done.exists()

    def started() -> bool:
        assert alive(), f"trackside demo ended before its run trained:\n{screen()}"
        return any(trainer_started(d) for d in (tmp_path / "runs").glob("*"))

    def step_drawn() -> bool:
        shown = screen()
        assert alive(), f"trackside demo ended before its run trained:\n{shown}"
        return "step" in shown and "loss" in shown

    # The dashboard's start and its trainer's (the torch import, as long as the machine's
    # load makes it), then the first step drawn.
    until(started, HANG_S, "the demo run's start event", interval=0.5)
    until(step_drawn, 90, "the demo run's first step on screen", interval=0.5)
    # As under Pilot: the run trains at nice 19, for the keys to meet a live one.
    panes = _tmux(tmux_socket, "list-panes", "-a", "-F", "#{session_name} #{pane_pid}").split("\n")
    background([int(pid) for name, _, pid in (p.partition(" ") for p in panes) if name.startswith("trackside-demo-")])
    cautious = 0  # keys left during which a dialog may still be on its way
    palette_due = 0  # keys left during which the palette may still open (Enter would run its command)
    try:
        while tally.keys < TMUX_KEYS:
            shown = screen()
            if "Stop run" in shown or "Relaunch while" in shown:
                key = rng.choice(["n", "escape"])
                tally.dialogs_answered_no += 1
            elif monkey.PALETTE_OPEN in shown:
                key = monkey.in_palette(rng, keys)
            else:
                key = rng.choice(keys)
                # No way to see a dialog on its way from here: no Yes, and for a few keys after
                # one that may open a dialog, nothing that moves focus onto its Yes button.
                while (key in monkey.ANSWERS_YES or (cautious and key in monkey.MOVES_FOCUS)
                       or (palette_due and key == "enter")):
                    key = rng.choice(keys)
            size = monkey.resize_to(rng, monkey.TMUX_SIZES)
            if size:
                _tmux(tmux_socket, "resize-window", "-t", "=dash:", "-x", str(size[0]), "-y", str(size[1]))
                tally.resizes += 1
            name = TMUX_NAMES.get(key, key)
            args = ["send-keys", "-t", "=dash:", *(["-l", name] if len(name) == 1 else [name])]
            times = monkey.presses(rng, key) if key not in ("n", "escape") else 1
            tally.doubles += times - 1
            for _ in range(times):
                _tmux(tmux_socket, *args)
                tally.keys += 1
            cautious, palette_due = max(0, cautious - 1), max(0, palette_due - 1)
            if key in monkey.OPENS_DIALOG:  # see whether a dialog came before the next key
                cautious = 3
                deadline = time.monotonic() + 1
                while time.monotonic() < deadline and not any(q in screen() for q in ("Stop run", "Relaunch while")):
                    time.sleep(0.1)
            elif key in monkey.OPENS_PALETTE:
                deadline = time.monotonic() + 1
                while time.monotonic() < deadline and monkey.PALETTE_OPEN not in screen():
                    time.sleep(0.05)
                palette_due = 3
            else:
                time.sleep(monkey.pause_s(rng))
            # The app gone, its demo run stopping: ended too (the exit status comes after the stop).
            ended = not alive() or "stopping the demo run" in screen()
            assert not ended, f"the dashboard ended after {key!r}:\n{history()}"
            assert "Traceback" not in shown, shown
    finally:
        record_property("summary", tally.line("tmux monkey"))
    runs_before = _tmux(tmux_socket, "list-sessions", "-F", "#{session_name}").split()
    assert any(s.startswith("trackside-demo-") for s in runs_before), "the demo run was stopped by the keys"
    # Quit: the demo stops its own run and says so. Escape three times (a filter open, the
    # log in full, a run screen), then until no dialog is in sight for a second, as one
    # looking at the pane would: a dialog asked for by the last keys may open after the
    # first Escapes (q typed into an edit form's field, or the filter, did not quit).
    for _ in range(3):
        _tmux(tmux_socket, "send-keys", "-t", "=dash:", "Escape")
        time.sleep(0.3)
    deadline = time.monotonic() + 60
    calm_since = None
    while calm_since is None or time.monotonic() - calm_since < 1.0:
        assert time.monotonic() < deadline, f"a dialog stayed up under Escape for a minute:\n{screen()}"
        if any(marker in screen() for marker in monkey.DIALOG_MARKERS):
            _tmux(tmux_socket, "send-keys", "-t", "=dash:", "Escape")
            calm_since = None
        elif calm_since is None:
            calm_since = time.monotonic()
        time.sleep(0.3)
    _tmux(tmux_socket, "send-keys", "-t", "=dash:", "q")
    deadline = time.monotonic() + 60
    while alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive(), f"the dashboard did not end within 60 s of Escape x3, q:\n{screen()}"
    assert done.read_text().strip() == "0", screen()
    assert "stopping the demo run" in screen() and "stopped in" in screen(), screen()
    left = _tmux(tmux_socket, "list-sessions", "-F", "#{session_name}").split()
    assert left == ["dash"], left
