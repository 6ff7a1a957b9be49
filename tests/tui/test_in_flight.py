"""The operator's actions under way are known by what they do and to which run (an
in-flight registry), from the moment they are asked for: not by worker names read back,
and not only once a worker has begun to run."""

from __future__ import annotations

import re
from pathlib import Path

from tests.tui.conftest import wait_for
from tests.tui.test_operator_keys import children, fake_run, open_run_when
from tui.screens.confirm import Confirm
from tui.screens.kill import KillConfirm

TUI = Path(__file__).resolve().parents[2] / "tui"


async def test_two_asks_in_one_breath_start_one_action(local_host):
    """Two kill keys handled before the first key's worker has started (one read of the
    terminal holding both): one dialog. Once it is answered No, the next k asks again."""
    _, key, app = await fake_run(local_host, "stall")
    async with app.run_test(size=(160, 48)) as pilot:
        await open_run_when(pilot, key, lambda run: run.steps, "the run's steps")
        app.action_kill()
        app.action_kill_relaunch()
        await wait_for(pilot, lambda: isinstance(app.screen, KillConfirm), 15, "the kill dialog")
        await pilot.pause(1.0)  # time for a second plan, had one been started
        assert [type(s) for s in app.screen_stack].count(KillConfirm) == 1, app.screen_stack
        await pilot.press("n")
        await pilot.pause()
        app.action_kill()
        await wait_for(pilot, lambda: isinstance(app.screen, KillConfirm), 15, "the kill dialog again")


async def test_r_twice_in_one_breath_on_an_ended_run_relaunches_it_once(local_host):
    info, key, app = await fake_run(local_host, "fail")
    async with app.run_test(size=(160, 48)) as pilot:
        await open_run_when(pilot, key, lambda run: run.info.state.value != "running", "the run's end")
        app.action_relaunch()
        app.action_relaunch()
        await wait_for(pilot, lambda: children(app, info), 30, "the relaunched run")
        await pilot.pause(2.0)  # a second relaunch, had one started, is listed by now
        assert len(children(app, info)) == 1, sorted(app.runs)
        assert not any(isinstance(s, Confirm) for s in app.screen_stack)


def test_no_worker_name_is_read_back_as_state():
    read_back = re.compile(r"\b(?:w|worker)\.name\s*(==|\.startswith|\.removeprefix)|_worker_under_way")
    found = [
        f"{path.relative_to(TUI)}:{n}: {line.strip()}"
        for path in TUI.rglob("*.py") for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if read_back.search(line)
    ]  # fmt: skip
    assert found == []
