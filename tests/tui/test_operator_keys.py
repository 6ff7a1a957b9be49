"""Keys as an operator meets them: the palette, `?`, `r` on a live run, `e` on a foreign
session, the log after a filter, `a` inside tmux."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from textual import events
from textual.command import CommandPalette
from textual.widgets import Log

from backends import runs
from backends.runs import RunInfo, RunPhase
from tests.backends.test_watch import TRAIN_COMMAND
from tests.tui.conftest import TRAIN, TRAINER, screen_text, wait_for
from tests.waiting import HANG_S, Changes, trainer_started
from tui.app import TracksideApp, Watched
from tui.messages import ConsoleBatch, RunsListed
from scripts.sample import NOW, RUN_KEY, feed, kill_plan, make_app, on_run
from tui.screens.confirm import Confirm
from tui.screens.fleet import FleetScreen
from tui.screens.help import HelpScreen
from tui.screens.kill import KillConfirm, KillReportScreen
from tui.screens.run import RunScreen
from tui.widgets.footer import Footer
from tui.widgets.loss_chart import LossChart

FOREIGN = RunInfo(None, "someone-elses", "h200-box", RunPhase.RUNNING, pids=[777])
TUI = Path(__file__).resolve().parents[2] / "tui"


async def test_the_palette_lists_the_run_actions_of_the_screen_it_was_opened_on():
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await on_run(pilot)
        await pilot.press("ctrl+p")
        palette = app.screen
        assert isinstance(palette, CommandPalette)
        await pilot.press(*"relaunch")
        await pilot.pause(0.5)
        shown = [str(option.prompt) for option in palette.query_one("CommandList").options]
        assert any("Relaunch (r)" in text for text in shown), shown
        await pilot.press("escape")
        assert isinstance(app.screen, RunScreen)


async def test_help_shows_the_apps_keys_not_the_widgets():
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await feed(pilot)
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        text = screen_text(app)
        for words in ("Kill the selected run", "Edit the selected run", "Filter the rows"):
            assert words in text
        assert "Scroll" not in text
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)


async def test_relaunch_of_a_running_run_asks_first_naming_it_and_no_launches_nothing():
    app = make_app()

    async def read_plan(run):  # the sample's host is a stand-in: its plan as `k` shows it
        return kill_plan()

    app.actions._read_plan = read_plan
    async with app.run_test(size=(160, 48)) as pilot:
        await on_run(pilot)
        await pilot.press("r")
        await wait_for(pilot, lambda: isinstance(app.screen, Confirm), 5, "r's question")
        question = app.screen.question.plain  # its title (the first line) and the rest
        assert RUN_KEY in question and "eagle3-8k" in question and "4200" in question
        await wait_for(pilot, lambda: getattr(app.focused, "id", None) == "no", 5, "No focused: the default answer")
        await pilot.press("enter")  # Enter on the focused default: No
        assert isinstance(app.screen, RunScreen)
        assert not [w for w in app.workers if w.group == "actions"]


async def test_foreign_sessions_cannot_be_edited_or_relaunched():
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await feed(pilot)
        app.post_message(RunsListed("h200-box", [FOREIGN], NOW))
        await pilot.pause()
        app.open_run("h200-box/someone-elses")
        await pilot.pause()
        for action in ("edit", "relaunch", "kill_relaunch"):
            assert app.check_action(action, ()) is None, action
        assert app.check_action("kill", ()) is True
        await pilot.press("e")
        await pilot.pause()
        assert isinstance(app.screen, RunScreen)


async def full_log_at_its_end(pilot) -> Log:
    """The run screen's log, 200 lines in and following them."""
    await on_run(pilot)
    pilot.app.post_message(ConsoleBatch("h200-box", RUN_KEY, [f"line {i} loss=1.0" for i in range(200)]))
    await pilot.pause(0.3)
    log = pilot.app.screen.query_one(Log)
    assert log.is_vertical_scroll_end
    return log


async def follows_a_new_line(pilot, log: Log, line: str) -> bool:
    pilot.app.post_message(ConsoleBatch("h200-box", RUN_KEY, [line]))
    await pilot.pause(0.3)
    return log.is_vertical_scroll_end and log.lines[-1] == line


async def test_the_log_follows_new_lines_again_after_a_filter_is_cleared():
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        log = await full_log_at_its_end(pilot)
        await pilot.press("slash", *"line 1", "escape")
        await pilot.pause(0.3)
        assert await follows_a_new_line(pilot, log, "the newest line loss=0.5")


async def test_the_log_keeps_following_when_the_layout_shrinks_it():
    """The stats above the log gain a line as a run goes on (or the terminal shrinks): the
    log, shorter, was left a line short of its end and Textual's Log stopped following."""
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        log = await full_log_at_its_end(pilot)
        await pilot.resize_terminal(160, 44)
        await pilot.pause(0.3)
        assert await follows_a_new_line(pilot, log, "the newest line loss=0.5")
        # one who scrolled up to read is left there
        log.scroll_to(y=10, animate=False, immediate=True)
        app.post_message(ConsoleBatch("h200-box", RUN_KEY, ["later still loss=0.4"]))
        await pilot.pause(0.3)
        assert log.scroll_y == 10


async def test_attach_inside_tmux_that_cannot_switch_says_so(monkeypatch, tmp_path):
    # TMUX names a server with no client: tmux refuses to switch, the app says what to run.
    monkeypatch.setenv("TMUX", f"{tmp_path}/no-such-server,1,0")
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await on_run(pilot)
        await pilot.press("a")
        await app.workers.wait_for_complete()
        await pilot.pause()
        messages = [n.message for n in app._notifications]
        assert any("cannot open eagle3-8k from inside tmux" in m and "run:" in m for m in messages), messages
        assert app.is_running


async def test_attach_outside_tmux_to_a_session_named_like_an_id_targets_that_session(monkeypatch, local_host):
    """tmux reads `=$0` as session id $0 whatever its name: a session named '$0' is
    attached by its own id, found on the host first (it raised ValueError, an alert)."""
    import subprocess

    from backends import tmux

    monkeypatch.delenv("TMUX", raising=False)
    for name in ("$0", "bystander"):
        subprocess.run(tmux.tmux_argv(local_host, "new-session", "-d", "-s", name, "sleep", "600"), check=True)
    named = {p.session: p.session_id for p in await tmux.list_panes(local_host)}
    app = make_app()
    app.watched["h200-box"] = Watched(local_host)
    async with app.run_test(size=(160, 48)) as pilot:
        app.post_message(RunsListed("h200-box", [RunInfo(None, "$0", "h200-box", RunPhase.RUNNING, pids=[1])], NOW))
        await wait_for(pilot, lambda: app.selected_run() is not None, what="the session's row")
        await pilot.press("a")
        await app.workers.wait_for_complete()
        told = await wait_for(pilot, lambda: [n.message for n in app._notifications if "cannot hand over" in n.message], what="the attach's command")
        assert told[0].endswith(f"attach-session -t '{named['$0']}'"), told
        assert app.is_running and app.errors == 0


async def test_a_host_without_nvidia_smi_reads_so_in_the_fleet_in_whole_words():
    from backends.gpu import GpuSnapshot, GpuStatus
    from tui.messages import GpusPolled

    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await feed(pilot)
        message = "no nvidia-smi: nvidia-smi: command not found"
        app.post_message(GpusPolled("laptop", GpuSnapshot(GpuStatus.NO_SMI, message), NOW))
        await pilot.pause()
        laptop = next(line for line in screen_text(app).splitlines() if line.strip().startswith("laptop"))
        assert laptop.rstrip().endswith("no nvidia-smi"), laptop


async def test_page_keys_in_the_same_breath_as_the_palette_do_not_end_the_app():
    """Textual's palette raised KeyError (and Textual ended the app) on Page Down before its
    list was laid out: found by the tmux monkey."""
    from textual import events

    for trial in range(10):
        app = make_app()
        async with app.run_test(size=(160, 48)) as pilot:
            await feed(pilot)
            for key in ("ctrl+p", "k", "pagedown", "pageup", "pagedown"):
                app.post_message(events.Key(key, key if len(key) == 1 else None))
            await pilot.pause(0.2)
            assert app.is_running and not app.return_code, f"trial {trial}"
            assert isinstance(app.screen, CommandPalette)


async def test_the_theme_palette_is_ours_and_its_page_keys_do_not_end_the_app():
    """The palette's "Theme" command opened Textual's own palette, whose page keys ended the
    app as ctrl+p's did (above): found by the tmux monkey on a fresh-clone run."""
    from textual import events

    from tui.screens.palette import CommandPalette as OurPalette

    for trial in range(10):
        app = make_app()
        async with app.run_test(size=(160, 48)) as pilot:
            await feed(pilot)
            app.action_change_theme()
            for key in ("pagedown", "pageup", "pagedown"):
                app.post_message(events.Key(key, None))
            await pilot.pause(0.2)
            assert app.is_running and not app.return_code, f"trial {trial}"
            assert isinstance(app.screen, OurPalette)


async def test_a_selection_queued_behind_the_palettes_close_selects_nothing():
    """Textual's palette dismisses itself by popping whatever screen is on top: Enter twice
    in one breath on a command popped the palette, then the screen under it, then found no
    screen to pop and Textual ended the app (ScreenStackError): found by the Pilot monkey."""
    from textual import events

    for trial in range(5):
        app = make_app()
        async with app.run_test(size=(160, 48)) as pilot:
            await feed(pilot)
            app.action_command_palette()
            await pilot.pause()
            await pilot.press(*"filter")
            await wait_for(pilot, lambda: not [w for w in app.screen.workers if w.is_running], 5, "the search")
            for _ in range(3):
                app.post_message(events.Key("enter", "\r"))
            await pilot.pause(0.5)
            assert app.is_running and not app.return_code, f"trial {trial}"
            assert isinstance(app.screen, FleetScreen), app.screen_stack


async def test_ctrl_p_while_the_last_palette_is_still_being_removed_is_dropped():
    """A palette closed a moment ago is still registered: a second one under the same id was
    refused (DuplicateIds, an internal error): found by the Pilot monkey."""
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await feed(pilot)
        app.action_command_palette()
        await pilot.pause()
        palette = app.screen
        assert isinstance(palette, CommandPalette)
        palette.dismiss()
        app.action_command_palette()  # before the closed one is gone
        await pilot.pause()
        assert isinstance(app.screen, CommandPalette) and app.screen.is_mounted and app.screen is not palette and app.errors == 0


async def test_the_palettes_no_matches_countdown_ending_after_its_list_is_gone_is_survived():
    """Textual's palette shows "No matches found" 0.5 s after a search found nothing, from a
    countdown that looks its list up again; closing as the countdown ended, it found no list
    (NoMatches) and Textual ended the app: found by the Pilot monkey ('sy?' typed, then R).
    Here the list is taken away once the search is done, so the countdown meets the same
    lookup (a trial whose countdown ended first, on a slow machine, is tried again)."""
    from textual.command import CommandList

    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await feed(pilot)
        for trial in range(5):
            app.action_command_palette()
            await pilot.pause()
            palette = app.screen
            assert isinstance(palette, CommandPalette)
            await pilot.press(*"zq?")
            await wait_for(pilot, lambda: not [w for w in palette.workers if w.is_running], 5, "the search")
            listed = palette.query_one(CommandList)
            if listed.option_count:  # "No matches found" is up already: too late
                await pilot.press("escape")
                continue
            await listed.remove()
            await wait_for(pilot, lambda: app.textual_errors, 5, "the countdown's lookup")
            break
        else:
            raise AssertionError("every search's countdown ended before its list could be removed")
        assert app.is_running and not app.return_code
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, CommandPalette)
        await pilot.press("question_mark")  # keys still work
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)


def test_the_charts_smoothing_reads_in_words():
    from tui.widgets.loss_chart import SMOOTHING, smoothing_words

    assert [smoothing_words(w) for w in SMOOTHING] == [
        "smoothing off", "smoothed over ~6 points", "smoothed over ~19 points", "smoothed over ~66 points",
    ]  # fmt: skip


async def test_l_on_the_fleet_opens_the_run_with_its_log_in_full():
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await feed(pilot)
        await pilot.press("l")
        await pilot.pause()
        assert isinstance(app.screen, RunScreen) and app.screen.maximized is app.screen.query_one(Log).parent


async def test_a_key_before_the_run_screen_has_composed_does_nothing():
    """A key that reaches a run screen pushed a moment ago, before its chart exists (x
    right behind Enter, found by the monkey), does nothing rather than fail."""
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await feed(pilot)
        app.open_run(RUN_KEY)
        screen = app.screen
        assert isinstance(screen, RunScreen) and not screen.is_mounted
        for action in (screen.action_x_axis, screen.action_log_scale, screen.action_smoothing, screen.action_back):
            assert action() is None
        await pilot.pause()
        assert app.errors == 0 and screen.is_mounted


@pytest.mark.parametrize("width", [160, 240])
async def test_the_footer_shows_every_key_beside_the_palette_key(width):
    """Textual's footer scrolls its keys under the palette key docked at its right: at
    160 columns the run screen's last key, `q Quit`, was cut to `q Qu`. The footer goes
    compact when its keys would not fit in full (the run screen's at 160), and only then."""
    app = make_app()
    async with app.run_test(size=(width, 48)) as pilot:
        await feed(pilot)
        for screen, opened in (("fleet", lambda: None), ("run", lambda: app.open_run(RUN_KEY))):
            opened()
            await pilot.pause()
            footer = app.screen.query_one(Footer)
            if screen == "run" or width == 240:
                compact = screen == "run" and width == 160
                await wait_for(pilot, lambda: footer.compact is compact, 5,
                               f"the {screen} screen's footer compact={compact}")
            await pilot.pause()
            keys = [k for k in footer.children if hasattr(k, "key_display")]
            palette = [k for k in keys if k.has_class("-command-palette")]
            assert len(palette) == 1 and len(keys) > 8
            edge = palette[0].region.x
            assert all(k.region.right <= edge for k in keys if k is not palette[0]), [
                (k.key_display, k.region) for k in keys]
            last_line = screen_text(app).splitlines()[-1]
            assert last_line.split("^p")[0].rstrip(" ▏").endswith("Quit"), last_line


@pytest.mark.parametrize("width", [60, 80, 100, 120])
async def test_a_narrow_footer_shows_whole_keys_the_operators_first(width):
    """Keys that do not fit are left out whole, the run's own (k e r R) and ? and q last
    of all: at 80 columns the run screen showed `... k Kill e E▏^p palette` and a stray
    cell of the scrolled keys right of the palette key ("paletten")."""
    app = make_app()
    async with app.run_test(size=(width, 24)) as pilot:
        await feed(pilot)
        for opened, screen in ((lambda: None, FleetScreen), (lambda: app.open_run(RUN_KEY), RunScreen)):
            opened()
            # drawn: its screen on top and its footer's palette key on the last line
            await wait_for(pilot, lambda: isinstance(app.screen, screen) and "▏" in (screen_text(app).splitlines() or [""])[-1], 10, f"{screen.__name__}'s footer")
            await pilot.pause(0.3)  # and its keys, laid out to the width
            footer = app.screen.query_one(Footer)
            shown = {k.key_display: k.description for k in footer.children if hasattr(k, "key_display")}
            line = screen_text(app).splitlines()[-1]
            keys, _, palette = line.partition("▏")
            assert palette.rstrip() == "^p palette", line
            pairs = " ".join(f"{key} {description}" for key, description in shown.items() if key != "^p")
            assert keys.split() == pairs.split(), line
            for key in ("k", "e", "r", "R", "?", "q") if width >= 80 else ("k", "e", "r", "R"):
                assert key in shown, (width, line)


async def fake_run(local_host, mode: str, **app_kwargs):
    """A stand-in trainer's run launched in `mode` (tests/backends/test_watch.py) and a
    dashboard over its host: (its info, its key, the app)."""
    info = await runs.launch(local_host, [*TRAIN_COMMAND, mode], train_command=TRAIN_COMMAND, startup_s=0)
    watched = Watched(local_host, smi="nvidia-smi-absent", train_command=TRAIN_COMMAND)
    return info, f"local/{info.run_id}", TracksideApp([watched], poll_interval=0.2, **app_kwargs)


async def open_run_when(pilot, key: str, ready, what: str) -> None:
    """Once the listed run is `ready`, its run screen."""
    await wait_for(pilot, lambda: key in pilot.app.runs and ready(pilot.app.runs[key]), 30, what)
    pilot.app.open_run(key)
    await pilot.pause()


async def kill_confirmed(pilot, letter: str) -> None:
    """`letter` (k or R), its dialog, y: then a moment into the trainer's 3 s of saving."""
    await pilot.press(letter)
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, KillConfirm), 60, "the kill dialog")  # its plan read off /proc and tmux: slow only at load
    await pilot.press("y")
    await pilot.pause(0.5)


def children(app, info) -> list[str]:
    return [k for k, r in app.runs.items() if r.info.parent == info.run_id]


# The actions of the keys, called in one breath: both asked for before the first one's
# worker has started (one read of the terminal holding both keys).
ACTIONS = {"k": "action_kill", "R": "action_kill_relaunch", "r": "action_relaunch"}


def press_all(app, keys: list[str], one_breath: bool) -> None:
    for k in keys:
        if one_breath:
            getattr(app, ACTIONS[k])()
        else:
            app.post_message(events.Key(k, k))


@pytest.mark.parametrize("keys, one_breath", [(["k", "k", "k"], False), (["R", "R"], False), (["k", "R"], False),
                                              (["k", "R"], True)])  # fmt: skip
async def test_kill_keys_in_quick_succession_open_one_dialog(local_host, keys, one_breath):
    """As a terminal delivers a double press (the app still reading the run's processes
    for the first): two or three kill dialogs stacked for the same run, each answerable.
    Known as under way from the moment it is asked for (the in-flight registry), not once
    a worker has begun; and no longer once its dialog is answered: the next k asks again."""
    _, key, app = await fake_run(local_host, "stall")
    async with app.run_test(size=(160, 48)) as pilot:
        await open_run_when(pilot, key, lambda run: run.steps, "the run's steps")
        press_all(app, keys, one_breath)
        await wait_for(pilot, lambda: isinstance(app.screen, KillConfirm), 15, "the kill dialog")
        await pilot.pause(1.0)  # time for a second plan, had one been started
        assert [type(s) for s in app.screen_stack].count(KillConfirm) == 1, app.screen_stack
        assert (app.screen.relaunch is not None) is (keys[0] == "R")  # the first key's dialog
        await pilot.press("n" if one_breath else "escape")
        await pilot.pause()
        assert isinstance(app.screen, RunScreen)
        app.action_kill()
        await wait_for(pilot, lambda: isinstance(app.screen, KillConfirm), 15, "the kill dialog again")


@pytest.mark.parametrize("one_breath", [False, True])
async def test_r_twice_on_an_ended_run_relaunches_it_once(local_host, one_breath):
    """r on an ended run relaunches at once, no question: a double press launched two
    copies of it (two children of one parent, each taking the GPU)."""
    info, key, app = await fake_run(local_host, "fail")
    async with app.run_test(size=(160, 48)) as pilot:
        await open_run_when(pilot, key, lambda run: run.info.state is not RunPhase.RUNNING, "the run's end")
        press_all(app, ["r", "r"], one_breath)
        await wait_for(pilot, lambda: children(app, info), 30, "the relaunched run")
        await pilot.pause(2.0)  # a second relaunch, had one started, is listed by now
        assert len(children(app, info)) == 1, sorted(app.runs)
        assert not any(isinstance(s, Confirm) for s in app.screen_stack)


def test_no_worker_name_is_read_back_as_state():
    """The actions under way are known by what they do and to which run (tui/in_flight.py),
    not by worker names read back."""
    read_back = re.compile(r"\b(?:w|worker)\.name\s*(==|\.startswith|\.removeprefix)|_worker_under_way")
    found = [
        f"{path.relative_to(TUI)}:{n}: {line.strip()}"
        for path in TUI.rglob("*.py") for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if read_back.search(line)
    ]  # fmt: skip
    assert found == []


async def test_R_again_while_the_run_is_being_stopped_relaunches_it_once(local_host):
    """R, y; then R or r again while the trainer is still saving on SIGTERM: no second
    dialog (answered Yes it relaunched the run twice); the run is relaunched once."""
    info, key, app = await fake_run(local_host, "slow-stop", grace_s=20)
    async with app.run_test(size=(160, 48)) as pilot:
        await open_run_when(pilot, key, lambda run: run.steps, "the run's steps")
        await kill_confirmed(pilot, "R")
        assert isinstance(app.screen, RunScreen) and app.screen.run_key == key
        await pilot.press("R")
        await pilot.press("r")  # nor a relaunch beside the one R will make
        await pilot.pause(1.5)
        assert not any(isinstance(s, (KillConfirm, Confirm)) for s in app.screen_stack), app.screen_stack
        await wait_for(pilot, lambda: children(app, info), 30, "the relaunched run")
        await pilot.pause(2.0)
        assert len(children(app, info)) == 1, sorted(app.runs)
        # The relaunch says how its start was judged: by the trainer's start event (in the
        # kill report where that is open, else in a toast).
        said, failed = await wait_for(pilot, lambda: app.actions.relaunch_words[key][0].startswith("relaunched as") and app.actions.relaunch_words[key],
                                      30, "the relaunch's word")  # fmt: skip
        assert not failed and "start event came" in said, said


@pytest.mark.parametrize("quit_key", ["q", "ctrl+q"])
async def test_q_during_a_kill_says_so_and_q_again_quits(local_host, quit_key):
    """q (or Textual's ctrl+q) while a kill waits out the trainer's SIGTERM would end the
    kill before its SIGKILL and release check: the first says so, a second quits."""
    _, key, app = await fake_run(local_host, "slow-stop", grace_s=20)
    told: list[str] = []
    notify = app.notify
    app.notify = lambda message, **kwargs: (told.append(str(message)), notify(message, **kwargs))[1]
    async with app.run_test(size=(160, 48)) as pilot:
        await open_run_when(pilot, key, lambda run: run.steps, "the run's steps")
        await kill_confirmed(pilot, "k")
        await pilot.press(quit_key)
        await pilot.pause()
        assert app.is_running and any(f"stopping {key} is under way" in t for t in told), told
        await pilot.press(quit_key)
        await wait_for(pilot, lambda: not app.is_running, 10, "the app to quit")


async def test_the_filter_opened_over_the_full_log_is_in_sight_and_one_escape_clears_it():
    """After `l` the log fills the screen: `/` opened its filter out of sight, and the
    first Escape only left the input (the placeholder says Esc clears)."""
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        log = await full_log_at_its_end(pilot)
        await pilot.press("l")
        await pilot.pause()
        assert app.screen.maximized is not None
        await pilot.press("slash", *"line 1")
        await pilot.pause(0.3)
        box = app.screen.query_one("#log-filter")
        assert app.focused is box
        assert box.region.height and app.screen.region.contains_region(box.region), box.region
        assert "line 1" in screen_text(app) and "line 20" not in screen_text(app)
        assert all("line 1" in line for line in log.lines)
        await pilot.press("escape")
        await pilot.pause(0.3)
        assert not box.display and box.value == ""
        assert any("line 20" in line for line in log.lines)
        assert app.screen.maximized is not None, "one Escape clears the filter, the log stays full"
        await pilot.press("escape")
        await pilot.pause()
        assert app.screen.maximized is None


async def test_the_palette_offers_the_run_screens_own_keys_and_the_way_back_to_the_fleet():
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await on_run(pilot)
        titles = {command.title: command for command in app.get_system_commands(app.screen)}
        for title in ("Log/lin y (y)", "Smoothing (s)", "Step/tokens (x)", "Overlay (o)", "Fleet (esc)"):
            assert title in titles, sorted(titles)
        chart = app.screen.query_one(LossChart)
        app.call_next(titles["Log/lin y (y)"].callback)  # as the palette runs it
        await pilot.pause()
        assert chart.log_y
        app.call_next(titles["Fleet (esc)"].callback)
        await pilot.pause()
        assert isinstance(app.screen, FleetScreen)
        fleet = {command.title for command in app.get_system_commands(app.screen)}
        assert not any(title.startswith("Smoothing") for title in fleet), fleet


async def test_the_palettes_screenshot_says_where_it_went_or_why_not(tmp_path, monkeypatch):
    app = make_app()
    said: list[str] = []
    notify = app.notify
    monkeypatch.setattr(app, "notify", lambda message, **kw: (said.append(str(message)), notify(message, **kw))[1])
    async with app.run_test(size=(80, 24)) as pilot:
        await feed(pilot)
        [screenshot] = [c for c in app.get_system_commands(app.screen) if c.title == "Screenshot"]
        monkeypatch.chdir(tmp_path)
        screenshot.callback()
        await pilot.pause(0.5)
        [saved] = list(tmp_path.glob("*.svg"))
        assert "h200-box" in saved.read_text()
        assert any(str(saved) in m for m in said), said
        gone = tmp_path / "gone"
        gone.mkdir()
        monkeypatch.chdir(gone)
        gone.rmdir()
        screenshot.callback()
        await pilot.pause(0.5)
        assert any("cannot save" in m and "No such file or directory" in m for m in said), said


@pytest.mark.timeout(600)  # two trainer starts, each bounded by HANG_S: a slow start fails on its own message
async def test_R_relaunches_once_the_gpu_is_free_while_the_checkpoint_is_still_being_written(local_host):
    """The trainer hands its checkpoint to a writer and exits: R's relaunch (which reads no
    checkpoint) starts then, not after the write; the kill's report follows with both
    times. The writer is held (SIGSTOP) the moment the trainer says it has the state, to
    show the order; a tiny state may be written before that moment, so up to four R's."""
    import json
    import os
    import signal
    import threading
    import time

    argv = [*TRAIN, "--steps", "100000", "--max-seq-len", "128", "--ttt-steps", "2", "--save-every", "0"]
    info = await runs.launch(local_host, argv, train_command=TRAINER)
    app = TracksideApp([Watched(local_host, smi="nvidia-smi-absent", train_command=TRAINER)], poll_interval=0.2)

    def hold_the_writer(run_dir: str, held: list[int], changes: Changes) -> None:
        """SIGSTOP the writer named by the run's `staged` event, woken by each write of it."""
        metrics = Path(run_dir, "metrics.jsonl")

        def staged() -> str | None:
            return next((line for line in metrics.read_text().splitlines()[::-1] if '"staged"' in line), None)

        with changes:
            if not changes.wait_until(staged, 60):
                return
        writer = json.loads(staged())["writer"]
        try:
            os.kill(writer, signal.SIGSTOP)
        except ProcessLookupError:
            return  # written already: not caught
        time.sleep(0.01)  # stopped by now
        if '"checkpoint"' in metrics.read_text().split('"staged"')[-1]:
            os.kill(writer, signal.SIGCONT)  # done before the stop: not caught
        else:
            held.append(writer)

    async with app.run_test(size=(160, 48)) as pilot:
        for _ in range(4):
            key = f"local/{info.run_id}"
            await wait_for(pilot, lambda: trainer_started(info.run_dir), HANG_S, "the trainer's start event")
            await open_run_when(pilot, key, lambda run: run.steps, "the run's steps")
            await pilot.press("R")
            await wait_for(pilot, lambda: isinstance(app.screen, KillConfirm), 15, "the kill dialog")
            held: list[int] = []
            changes = Changes(info.run_dir)  # before y: the staged event is not missed
            holder = threading.Thread(target=hold_the_writer, args=(info.run_dir, held, changes), daemon=True)
            holder.start()
            await pilot.press("y")
            await wait_for(pilot, lambda: not holder.is_alive(), 60, "the trainer's staged event")
            try:
                [child] = await wait_for(pilot, lambda: children(app, info), 60, "the relaunched run")
                said = [json.loads(line)["event"] for line in Path(info.run_dir, "metrics.jsonl").read_text().splitlines()]
                if held:  # relaunched while the write was held: no checkpoint event yet
                    assert said[-2:] == ["staged", "end"] and not isinstance(app.screen, KillReportScreen), said
            finally:
                for pid in held:
                    os.kill(pid, signal.SIGCONT)
            report = await wait_for(pilot, lambda: isinstance(app.screen, KillReportScreen) and app.screen.is_mounted and app.screen, 60, "the kill's report")
            assert report.report.checkpoint == "durable" and report.report.gpu_released_s <= report.report.checkpoint_durable_s
            if held:
                return
            await pilot.press("escape")
            app.pop_screen()  # the relaunched run's screen: the next R is on it
            info = app.runs[child].info
        pytest.fail("the writer was done before it could be held, four times")


def plan_shown(dialog) -> str:
    """What the kill dialog's scrolling body holds (at 80×24 its end is below the fold)."""
    from textual.widgets import Static

    body = next(dialog.query("#kill-plan").results(Static), None)
    return "" if body is None else str(body.content)  # "" until the dialog is composed


@pytest.mark.timeout(600)  # two trainer starts, each bounded by HANG_S: a slow start fails on its own message
async def test_R_with_c_relaunches_the_edited_run_from_its_checkpoint_at_80x24(local_host):
    """R's dialog on the real trainer at 80×24 offers to continue from the checkpoint; c
    turns it on (and off again, and on): the relaunch, with the edit, resumes at the step
    the stop saved, after waiting for its writer."""
    import json
    from pathlib import Path

    argv = [*TRAIN, "--steps", "100000", "--max-seq-len", "128", "--ttt-steps", "2", "--save-every", "0"]
    info = await runs.launch(local_host, argv, train_command=TRAINER)
    app = TracksideApp([Watched(local_host, smi="nvidia-smi-absent", train_command=TRAINER)], poll_interval=0.2)
    key = f"local/{info.run_id}"
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: trainer_started(info.run_dir), HANG_S, "the trainer's start event")
        await open_run_when(pilot, key, lambda run: len(run.steps) >= 2, "the run's steps")
        app.store.edited(key, {"max_seq_len": 192})
        await pilot.press("R")
        dialog = await wait_for(pilot, lambda: isinstance(app.screen, KillConfirm) and app.screen.is_mounted and app.screen, 15, "the kill dialog")
        await wait_for(pilot, lambda: "afresh (c: continue from its checkpoint instead)" in plan_shown(dialog), 5, "R's afresh plan")
        for _ in range(3):
            await pilot.press("c")
        assert dialog.resume and "continuing from its checkpoint" in plan_shown(dialog)
        await pilot.press("y")
        [child] = await wait_for(pilot, lambda: children(app, info), 60, "the relaunched run")
        start = await wait_for(pilot, lambda: app.runs[child].start, HANG_S, "the child's start event")
        said = app.runs[child].startup_said()
    stopped = [json.loads(line) for line in Path(info.run_dir, "metrics.jsonl").read_text().splitlines()]
    last_step = [e["step"] for e in stopped if e["event"] == "step"][-1]
    saved = [e["step"] for e in stopped if e["event"] == "checkpoint"]
    assert saved == [last_step]
    assert start["config"]["resumed_from_step"] == last_step and start["config"]["max_seq_len"] == 192
    assert "resume" in said
    # Started as the SIGTERM went out, it waited for the stopping run (and then its writer).
    assert "replaced_run" in start["startup_s"]


@pytest.mark.timeout(600)  # two trainer starts, each bounded by HANG_S: a slow start fails on its own message
async def test_R_starts_the_new_trainer_while_the_old_one_stops_at_80x24(local_host):
    """R afresh on the real trainer: the new trainer's process starts as the SIGTERM goes
    out and waits while the stopped run's trainer is still there (held here with SIGSTOP,
    as a slow stop would hold it); it starts once that one has ended, and its start-up
    says how long it waited."""
    import json
    import os
    import signal
    import subprocess
    from pathlib import Path

    argv = [*TRAIN, "--steps", "100000", "--max-seq-len", "128", "--ttt-steps", "2", "--save-every", "0"]
    info = await runs.launch(local_host, argv, train_command=TRAINER)
    app = TracksideApp([Watched(local_host, smi="nvidia-smi-absent", train_command=TRAINER)], poll_interval=0.2)
    key = f"local/{info.run_id}"
    [trainer] = map(int, subprocess.run(["pgrep", "-P", str(info.pids[0])], capture_output=True, text=True).stdout.split())
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: trainer_started(info.run_dir), HANG_S, "the trainer's start event")
        await open_run_when(pilot, key, lambda run: run.steps, "the run's steps")
        app.store.edited(key, {"max_seq_len": 192})
        os.kill(trainer, signal.SIGSTOP)
        try:
            await kill_confirmed(pilot, "R")
            [child] = await wait_for(pilot, lambda: children(app, info), 30, "the relaunched run")
            console = Path(app.runs[child].info.run_dir, "console.log")
            await wait_for(pilot, lambda: console.exists() and "waiting for the run this replaces" in console.read_text(),
                           HANG_S, "the new trainer waiting")  # fmt: skip
            await pilot.pause(2.0)
            assert app.runs[child].start is None  # not started while the old one is there
        finally:
            os.kill(trainer, signal.SIGCONT)
        start = await wait_for(pilot, lambda: app.runs[child].start, HANG_S, "the child's start event")
        await wait_for(pilot, lambda: app.runs[child].steps, 60, "the child's first step")
        said = app.runs[child].startup_said()
    stopped = [json.loads(line) for line in Path(info.run_dir, "metrics.jsonl").read_text().splitlines()]
    ended = next(e for e in stopped if e["event"] == "end")
    assert start["process_started"] < ended["time"] < start["time"]
    assert start["startup_s"]["replaced_run"] >= 2.0 and start["config"]["max_seq_len"] == 192
    assert "the run it replaces stopping" in said
