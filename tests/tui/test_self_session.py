"""The dashboard's own session in the fleet: shown as "this dashboard"; `k` and `R` on it say
why they refuse and open no dialog, while on another run they open the kill plan.

The app's process cannot run inside a test's tmux pane, so the test gives it that pane's
$TMUX and $TMUX_PANE, as tmux would: recognition itself is real (backends.own_session).
"""

from __future__ import annotations

import subprocess

from backends import runs
from tests.tui.conftest import screen_text, wait_for
from tui.app import TracksideApp, Watched
from tui.screens.kill import KillConfirm

REFUSAL = "is the tmux session this dashboard runs in"


async def test_k_and_R_refuse_the_dashboards_own_session(local_host, tmux_socket, monkeypatch):
    def tmux(*args: str) -> str:
        return subprocess.run(["tmux", "-L", tmux_socket, *args], capture_output=True, text=True, check=True).stdout.strip()

    other = await runs.launch(local_host, ["sleep", "600"])
    mine = await runs.launch(local_host, ["sleep", "600"])
    monkeypatch.setenv("TMUX", tmux("display-message", "-p", "#{socket_path},#{pid},0"))
    monkeypatch.setenv("TMUX_PANE", tmux("list-panes", "-t", f"={mine.session}:", "-F", "#{pane_id}"))
    app = TracksideApp([Watched(local_host, smi="nvidia-smi-absent")])
    async with app.run_test(size=(160, 48)) as pilot:
        keys = {f"local/{info.run_id}": info for info in (mine, other)}
        await wait_for(pilot, lambda: keys.keys() <= app.runs.keys(), 15, "both runs in the fleet")
        assert app.runs[f"local/{mine.run_id}"].info.this_dashboard
        assert not app.runs[f"local/{other.run_id}"].info.this_dashboard
        assert screen_text(app).count("this dashboard") == 1

        for key, info in keys.items():
            while app.screen.selected_run_key() != key:
                await pilot.press("down")
            for press in ("k", "R"):
                app.clear_notifications()
                await pilot.press(press)
                if info is mine:
                    await wait_for(pilot, lambda: any(REFUSAL in str(n.message) for n in app._notifications), 10, "the refusal")
                    await pilot.pause(0.5)
                    assert not isinstance(app.screen, KillConfirm)
                else:
                    confirm = await wait_for(pilot, lambda: isinstance(app.screen, KillConfirm) and app.screen.is_mounted and app.screen, 10, "the kill plan")
                    assert confirm.plan.session == other.session
                    await pilot.press("n")
                    await wait_for(pilot, lambda: not isinstance(app.screen, KillConfirm), 5, "the dialog to close")
    assert tmux("list-panes", "-t", f"={mine.session}:", "-F", "#{pane_dead}") == "0"
