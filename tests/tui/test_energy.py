"""A run's GPU-hours and energy so far on the fleet and its run screen (tui/energy.py): the
columns where they fit (80 columns keeps the others uncut), a lower bound and a split
said, and a run without a recording saying why rather than 0."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path

import pytest
from textual.widgets import DataTable, Static

from backends import runs
from backends.recorder.energy import Charge
from backends.recorder import layout
from backends.recorder.read import read_recording
from backends.recorder.start import Settings, recorder
from scripts.sample import FOREIGN_KEY, RUN_KEY, feed_foreign, make_app, on_run
from tests.tui.conftest import wait_for
from tests.waiting import until
from tui import energy
from tui.app import TracksideApp
from tui.messages import EnergyMetered
from tui.screens.fleet import NARROW
from tui.state import format_number
from tui.watched import Watched

HOUR_AT_450W = Charge(gpu_s=3 * 3600.0, joules=3 * 3600 * 450.0)  # three cards for an hour: 1.35 kWh


def cell(app, row: str, column: str) -> str:
    return str(app.screen.query_one(DataTable).get_cell(row, column))


async def test_the_fleet_shows_gpu_hours_and_kwh_where_they_fit():
    app = make_app()
    async with app.run_test(size=(200, 40)) as pilot:
        await feed_foreign(pilot)
        run, foreign = f"run:{RUN_KEY}", f"run:{FOREIGN_KEY}"
        assert cell(app, run, "gpuh") == "…"  # not read yet: no figure, and no 0
        shared_short = Charge(gpu_s=1800.0, joules=1800 * 300.0, at_least=True, shared=True)
        app.post_message(EnergyMetered("h200-box", {RUN_KEY: HOUR_AT_450W, FOREIGN_KEY: shared_short}, None))
        await wait_for(pilot, lambda: cell(app, run, "gpuh") == "3", 10, "the run's GPU-hours")
        assert cell(app, run, "kwh") == "1.35"
        assert (cell(app, foreign, "gpuh"), cell(app, foreign, "kwh")) == ("≥0.5÷", "≥0.15÷")
        app.post_message(EnergyMetered("h200-box", {}, ("off", "not recorded: the recorder is off for h200-box (record = false)")))
        await wait_for(pilot, lambda: cell(app, run, "kwh") == "rec off", 10, "the recorder off said")
    narrow = make_app()
    async with narrow.run_test(size=(80, 24)) as pilot:
        await feed_foreign(pilot)
        narrow.post_message(EnergyMetered("h200-box", {RUN_KEY: HOUR_AT_450W}, None))
        await pilot.pause()
        shown = [c.key.value for c in narrow.screen.query_one(DataTable).ordered_columns]
        assert set(NARROW) <= set(shown) and "kwh" not in shown, shown


async def test_the_run_screen_says_the_figures_or_why_there_are_none():
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await on_run(pilot)
        stats = app.screen.query_one("#stats", Static)
        app.post_message(EnergyMetered("h200-box", {}, ("none", "the recorder on h200-box has recorded nothing yet")))
        await wait_for(pilot, lambda: "recorded nothing yet" in str(stats.render()), 10, "why there are no figures")
        app.post_message(EnergyMetered("h200-box", {RUN_KEY: Charge(3600.0, 3600 * 300.0, at_least=True, shared=True)}, None))
        await wait_for(pilot, lambda: "kWh" in str(stats.render()), 10, "the figures")
        said = str(stats.render())
        assert "GPU at least 1 h  energy at least 0.3 kWh so far" in said, said
        assert "split by used memory" in said and "misses some of its time" in said, said


FAKE_SMI = str(Path(__file__).resolve().parents[1] / "fake_nvidia_smi.py")
IDLE_W = 77.99  # the stand-in's power draw, idle (tests/fixtures/h200/query-gpu-idle-nounits.csv)


def child(pane_pid: int) -> int:
    """The one process under a pane's shell (its `sleep`), once the shell has started it."""
    found = until(lambda: Path(f"/proc/{pane_pid}/task/{pane_pid}/children").read_text().split(), 30, f"a child of {pane_pid}")
    assert len(found) == 1, found
    return int(found[0])


async def test_a_runs_figures_from_the_real_recorder_are_the_stand_ins_power_times_its_time(tmp_path, local_host, monkeypatch):
    """A run on trackside's tmux server whose process the stand-in nvidia-smi lists on GPU 0
    for a while, a bystander session's on GPU 1 all along, the real recorder recording
    both: the run is charged GPU 0's draw over the time its process held it, within the
    recorder's step, and no more (the bystander's card is not its own); shown at 80×24 on
    its screen, and by the fleet where it is wide enough."""
    held = tmp_path / "gpu-procs.json"
    held.write_text("[]")
    # The tmux server the recorder starts, and every session in it, have the stand-in's settings.
    monkeypatch.setenv("FAKE_NVIDIA_SMI_PROCS", str(held))
    monkeypatch.setenv("FAKE_NVIDIA_SMI_GPUS", "2")
    tick = Settings(tick_s=1.0)
    assert await recorder(local_host, "start", FAKE_SMI, tick) == "started"
    run = await runs.launch(local_host, ["sleep", "600"])
    assert run.state is runs.RunPhase.RUNNING, run
    tmux_cmd = ["tmux", "-L", local_host.tmux_socket]
    subprocess.run([*tmux_cmd, "new-session", "-d", "-s", "bystander", "sh", "-c", "sleep 600; :"], check=True)
    bystander_pane = int(subprocess.run([*tmux_cmd, "list-panes", "-t", "=bystander:", "-F", "#{pane_pid}"],
                                        capture_output=True, text=True, check=True).stdout)  # fmt: skip
    trainer, bystander = child(run.pids[0]), {"pid": child(bystander_pane), "gpu": 1, "used_mib": 9000, "name": run.session}
    on_gpu = time.time()
    held.write_text(json.dumps([{"pid": trainer, "gpu": 0, "used_mib": 4000, "name": run.session}, bystander]))
    key = f"local/{run.run_id}"
    app = TracksideApp([Watched(local_host, FAKE_SMI)], poll_interval=0.5)
    async with app.run_test(size=(80, 24)) as pilot:
        charge = lambda: energy.charge_of(app.runs[key]) if key in app.runs else None  # noqa: E731
        await wait_for(pilot, lambda: (c := charge()) is not None and c.gpu_s >= 4, 120, "the run charged 4 GPU-seconds")
        held.write_text(json.dumps([bystander]))  # its process has let the card go
        off_gpu = time.time()
        # The recorder's snapshots say when it held the card (`on`, `off`): it is charged
        # the card's readings from then to then, each a second apart (the recorder's loop).
        on, off, readings = await held_between(local_host, trainer, on_gpu)
        held_s = min(t for t in readings if t >= off) - min(t for t in readings if t >= on)
        assert abs(held_s - (off - on)) <= 2 * layout.LOOP_MS / 1000 and held_s >= 4, (held_s, on, off)
        assert on_gpu <= on and off <= off_gpu + 10 * tick.tick_s, (on_gpu, on, off, off_gpu)
        await wait_for(pilot, lambda: charge().gpu_s == pytest.approx(held_s), 60, f"the run charged its {held_s:.1f} s")
        c = charge()
        assert c.joules == pytest.approx(IDLE_W * c.gpu_s) and not c.at_least and not c.shared, c
        bystander_charge = energy.charge_of(app.runs["local/bystander"])
        assert bystander_charge is not None and 0 < bystander_charge.gpu_s <= time.time() - on_gpu
        app.open_run(key)
        found = await wait_for(pilot, lambda: app.screen.query("#stats"), 30, "the run screen")
        stats = found.first(Static)
        await wait_for(pilot, lambda: "kWh so far" in str(stats.render()), 30, "the run screen's figures")
        said = f"GPU {format_number(c.gpu_hours, 3)} h  energy {format_number(c.kwh, 3)} kWh so far"
        assert said in str(stats.render()) and charge() == c, str(stats.render())
        await pilot.press("escape")
        await pilot.resize_terminal(200, 24)
        await wait_for(pilot, lambda: "kwh" in [k.value for k in app.screen.query_one(DataTable).columns], 10, "the fleet's energy columns")
        await pilot.pause()
        shown = cell(app, f"run:{key}", "gpuh"), cell(app, f"run:{key}", "kwh")
        assert shown == energy.cells(app.runs[key]) == (format_number(c.gpu_hours, 3, width=7), format_number(c.kwh, 3, width=7)), shown


async def held_between(host, pid: int, since: float) -> tuple[float, float, list[float]]:
    """When the recorder's snapshots first listed `pid` on GPU 0 and first did not again,
    and the times GPU 0 was read, once it has been read after that."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        rec = await read_recording(host, since - 10)
        listing = {t: {p.pid for p in rec.procs if p.time == t} for t in rec.proc_times}
        on = next((t for t in sorted(listing) if pid in listing[t]), None)
        off = next((t for t in sorted(listing) if on is not None and t > on and pid not in listing[t]), None)
        readings = [g.time for g in rec.gpus if g.index == 0]
        if off is not None and max(readings) >= off:
            return on, off, readings
        await asyncio.sleep(0.2)
    raise AssertionError(f"the recorder never listed {pid} and then stopped listing it")


async def test_a_run_without_a_recording_says_why_rather_than_0(local_host):
    """The host's recorder off in the config; on, but not started (nothing recorded)."""
    run = await runs.launch(local_host, ["sleep", "600"])
    key = f"local/{run.run_id}"
    for record, said, short in [(False, "the recorder is off for local", "rec off"), (True, "has not recorded anything yet", "no rec")]:
        app = TracksideApp([Watched(local_host, FAKE_SMI, record=record)], poll_interval=0.5)
        async with app.run_test(size=(200, 24)) as pilot:
            await wait_for(pilot, lambda: app.runs.get(key) and app.runs[key].energy, 60, "the run's energy said")
            await pilot.pause()
            assert cell(app, f"run:{key}", "kwh") == short and cell(app, f"run:{key}", "gpuh") == short
            assert said in energy.line(app.runs[key]), energy.line(app.runs[key])
