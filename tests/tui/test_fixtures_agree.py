"""The dashboard reads every captured trainer as its library recorded it, and as
`trackside runs --json` does.

Each fixture of tests/fixtures/consoles/ (real libraries' output, as their panes received
it) is printed again in a tmux pane of 80×24 on this test's own tmux server once a
dashboard of 80×24 watches it (so every byte is in its recording, as in test_replay's
"recording" way). Then, for every session, the fleet's row and the run screen, as the app
renders them, are compared with the library's own record by test_replay's one comparison:
no field wrong, blank only where its BLANK says. The fleet's row and the headless
command's JSON must also agree on state, step, loss and ETA: one fold, one record,
whichever view reads it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from backends.alerts import format_duration
from backends.hosts import LocalHost
from tests.backends.test_formats import FIXTURES, NAMES, shown_as, truth
from tests.backends.test_replay import BLANK, wrong_and_blank
from tests.backends.test_runs import tmux_dir  # noqa: F401 (fixture)
from tests.tui.conftest import screen_text, wait_for
from tui.app import TracksideApp, Watched
from tui.screens.fleet import run_cells
from tui.screens.run import RunScreen
from tui.state import X_SHORT

SESSIONS = {re.sub(r"[^A-Za-z0-9_-]", "_", name): name for name in NAMES}
NUMBER = r"(-?[\d,]*\.?\d+(?:e[+-]?\d+)?|-?inf|nan|—)"  # format_number's shapes; — is none


def number(text: str | None) -> float | None:
    """A number as the dashboard printed it, back to a number; `—` or nothing is blank."""
    if text is None or text == "—":
        return None
    value = float(text.replace(",", ""))
    return int(value) if value.is_integer() and "." not in text and "e" not in text else value


def fleet_cells(app, session: str) -> dict[str, object]:
    """The fleet's row for a session, cell by cell as its table holds them to draw."""
    table = app.screen.query_one("#fleet")
    return dict(zip((c.key.value for c in table.ordered_columns), table.get_row(f"run:local/{session}")))


def fleet_row(app, session: str) -> dict[str, object]:
    cells = fleet_cells(app, session)
    step = re.match(NUMBER, str(cells["step"]))  # `152 (epoch 2, 48/104)`, `40 rd` at 80 columns
    return {"last_step": number(step and step[1]), "last_loss": number(str(cells["loss"]).strip()), "eval_loss": None}


def unit_wrong(name: str, app, session: str) -> list[str]:
    """The fleet's step column says what it counts where that is not steps (`40 rd`)."""
    cells = fleet_cells(app, session)
    said = re.fullmatch(rf"{NUMBER}(?: (\w+))?", str(cells["step"]).strip())
    axis = truth(name).get("x") or "step"
    if said and said[1] != "—" and said[2] != X_SHORT.get(axis):
        return [f"its step column says {str(cells['step']).strip()!r}, the library counts {axis}"]
    return []


def stats_drawn(app) -> str:
    """The run screen's stats as the screen draws them: the lines of its region."""
    if not isinstance(app.screen, RunScreen):
        return ""
    box = app.screen.query_one("#stats").content_region
    return "\n".join(line[box.x:box.right].strip() for line in screen_text(app).splitlines()[box.y:box.bottom])


AXIS = "step|round|epoch|n_updates"  # what the stats' count says it counts


def run_screen(text: str) -> dict[str, object]:
    """The run screen's step, loss and evaluation loss, read off its drawn stats."""
    said = {field: re.search(rf"^{label} {NUMBER}", text, re.M) for field, label in
            (("last_step", f"(?:{AXIS})"), ("last_loss", "loss"), ("eval_loss", "eval loss"))}  # fmt: skip
    return {field: number(found and found[1]) for field, found in said.items()}


def dating_wrong(name: str, text: str) -> list[str]:
    """The words and dates the stats put on their numbers, against the record: the count is
    named for what the library counts, and an evaluation dated `at W N` was its loss at N."""
    doc, bad = truth(name), []
    axis = doc.get("x") or "step"
    count = re.search(rf"^({AXIS}) {NUMBER}", text, re.M)
    if count and count[2] != "—" and count[1] != axis:
        bad.append(f"its count says {count[1]}, the library counts {axis}")
    dated = re.search(rf"^eval loss {NUMBER} at ({AXIS}) (\d+)", text, re.M)
    if dated:
        if dated[2] != axis:
            bad.append(f"eval loss dated by {dated[2]}, the library counts {axis}")
        at = int(dated[3])
        if not any(x == at and shown_as(number(dated[1]), v) for x, v in doc["eval"]):
            bad.append(f"eval loss {dated[1]} at {dated[2]} {at}: the record's there is "
                       f"{[v for x, v in doc['eval'] if x == at] or 'none'}")
    return bad


async def test_the_dashboard_reads_every_fixture_as_its_library_recorded_it(tmux_dir, runs_root, tmp_path):  # noqa: F811
    host = LocalHost(runs_root=runs_root)
    app = TracksideApp([Watched(host, smi="nvidia-smi-absent")], poll_interval=0.5)
    async with app.run_test(size=(80, 24)) as pilot:
        for session, name in SESSIONS.items():
            raw = FIXTURES / f"{name}.raw"
            play = f'tmux wait-for go-{session}; cat "$1"; tmux wait-for -S played-{session}; exec sleep 600'
            subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "80", "-y", "24", "sh", "-c", play, "sh", str(raw)],
                           check=True)  # fmt: skip
        keys = [f"local/{s}" for s in SESSIONS]
        await wait_for(pilot, lambda: all(k in app.runs and app.runs[k].info.recorded_since for k in keys), 60,
                       "every session in the fleet, recorded")  # fmt: skip
        for session in SESSIONS:
            subprocess.run(["tmux", "wait-for", "-S", f"go-{session}"], check=True, timeout=60)
        for session in SESSIONS:
            subprocess.run(["tmux", "wait-for", f"played-{session}"], check=True, timeout=60)

        # Every row reads what it will read once the dashboard has read its whole recording.
        def settled():
            return all(not wrong_and_blank(name, fleet_row(app, s))[1] - BLANK.get(name, set()) - {"eval_loss"}
                       for s, name in SESSIONS.items())  # fmt: skip

        await wait_for(pilot, settled, 60, "every row's step and loss, but for BLANK's")
        await pilot.pause(3.0)  # a listing or two after the last byte: every row as it ends
        config = tmp_path / "config.toml"
        config.write_text(f"[hosts.box]\nruns_root = {json.dumps(runs_root)}\n")
        done = subprocess.run([sys.executable, "-m", "tui.cli", "runs", "--json", "--config", str(config)],
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert done.returncode == 0, done.stderr
        listed = {r["session"]: r for r in json.loads(done.stdout)}
        wrong, blanks = {}, {}
        for session, name in SESSIONS.items():
            run, doc = app.runs[f"local/{session}"], listed[session]
            cells = run_cells(run, app.hosts["local"])
            shown = (run.state_label, run.step, run.loss, cells["eta"])
            said = (doc["status"], doc["last_step"], doc["last_loss"], format_duration(doc["eta_s"]))
            assert shown == said, f"{session}: fleet {shown}, runs --json {said}"
            assert cells["state"].plain.startswith(doc["status"])

            row = fleet_row(app, session)
            app.open_run(f"local/{session}")
            await pilot.pause()
            text = await wait_for(pilot, lambda: "\nstate " in stats_drawn(app) and stats_drawn(app), 10, f"{session}'s run screen")
            screen = run_screen(text)
            app.pop_screen()
            await pilot.pause()
            await wait_for(pilot, lambda: not isinstance(app.screen, RunScreen), 10, "the fleet again")
            bad_row, blank_row = wrong_and_blank(name, row)
            bad_row += unit_wrong(name, app, session)
            bad_screen, blank_screen = wrong_and_blank(name, screen)
            bad_screen += dating_wrong(name, text)
            if bad_row or bad_screen:
                wrong[name] = [f"fleet {w}" for w in bad_row] + [f"run screen {w}" for w in bad_screen]
            if blank_screen or blank_row - {"eval_loss"}:  # the fleet has no evaluation column
                blanks[name] = blank_screen | (blank_row - {"eval_loss"})
        assert wrong == {}, "read wrong"
        assert blanks == BLANK


def test_every_fixture_has_a_session_name():
    assert len(SESSIONS) == len(NAMES) and all(Path(FIXTURES / f"{n}.raw").exists() for n in NAMES)
