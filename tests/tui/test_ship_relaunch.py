"""`R` on a run whose code here has changed since it was shipped (issue 36, item 3): the
dashboard offers "ship and relaunch" with the files that differ, sends them before the
kill, and the child runs the edited code while the parent ran the old; a synced directory
of another trainer likewise; a ship that fails stops nothing. Over the real sshd, through a
container-like prefix."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from backends import runs
from backends.runs import RunPhase
from backends.ship.deliver import Delivery
from backends.ship.sync import SyncEntry
from tests.backends.test_runs import tmux_dir  # noqa: F401 (fixture)
from tests.backends.test_ship import package, set_value, start_value
from tests.backends.test_sync import box_dir, printed, work_dir
from tests.tui.conftest import screen_text, wait_for
from tests.tui.test_operator_keys import children, open_run_when
from tui.app import TracksideApp, Watched
from tui.screens.kill import KillConfirm
from tui.screens.ship import ShipRelaunch

TRAIN = ["trackside", "train", "--synthetic"]


@pytest.fixture
async def box(sshd, runs_root, tmux_dir, tmp_path):
    """The sshd as a GPU box reached through a prefix (`pct exec 129 --` in life) that
    sets the environment of its commands: this test's tmux, and a `df` that says the disk
    is full once `full` exists."""
    if not sshd.running:
        sshd.start()
    fakes = tmp_path / "fakes"
    fakes.mkdir()
    (fakes / "df").write_text(
        f"#!/bin/sh\n[ -e {fakes}/full ] || exec /usr/bin/env PATH={os.environ['PATH']} df \"$@\"\n"
        "printf 'Filesystem 1024-blocks Used Available Capacity Mounted\\nfake 1000 900 100 90%% /\\n'\n"
    )
    (fakes / "df").chmod(0o755)
    prefix = ["env", f"TMUX_TMPDIR={tmux_dir}", f"PATH={fakes}:{os.environ['PATH']}"]
    host = sshd.host("gpu", prefix=prefix, runs_root=runs_root)
    yield host, fakes / "full"
    await host.close()


async def shipped_run(tmp_path, host, python) -> tuple[Path, runs.RunInfo]:
    """A run launched from a shipped package, whose value.py is then edited here."""
    source = package(tmp_path)
    sent = await Delivery(source, str(python)).send(host)
    parent = await runs.launch(host, TRAIN, sent=sent)
    set_value(source, "new")
    return source, parent


async def ship_kill(pilot) -> tuple[ShipRelaunch, str]:
    """R on the run, its ship dialog (and what it showed) answered Ship, the kill's Yes."""
    app = pilot.app
    await pilot.press("R")
    offer = await wait_for(pilot, lambda: isinstance(app.screen, ShipRelaunch) and app.screen.is_mounted and app.screen, 30, "the ship dialog")
    text = await wait_for(pilot, lambda: "Ship and relaunch" in (shown := screen_text(app)) and shown, 5, "the dialog drawn")
    await pilot.press("s")
    await wait_for(pilot, lambda: isinstance(app.screen, KillConfirm), 15, "the kill dialog")
    await pilot.press("y")
    return offer, text


async def test_R_ships_the_edited_code_before_the_kill_and_the_child_runs_it(tmp_path, box, sshd):
    host, _ = box
    source, parent = await shipped_run(tmp_path, host, sshd.python)
    app = TracksideApp([Watched(host, smi="nvidia-smi-absent")], poll_interval=0.2, grace_s=5)
    async with app.run_test(size=(80, 24)) as pilot:
        key = f"gpu/{parent.run_id}"
        await open_run_when(pilot, key, lambda run: run.info.state is RunPhase.RUNNING, "the shipped run")
        offer, shown = await ship_kill(pilot)
        assert offer.differing == [(f"{source} → gpu", ["M training/value.py"])]
        assert "M training/value.py" in shown and "Ship and relaunch" in shown, shown
        [child_key] = await wait_for(pilot, lambda: children(app, parent), 60, "the relaunched run")
        child = await wait_for(pilot, lambda: app.runs[child_key].info.run_dir, 30, "its run dir")
        await wait_for(pilot, lambda: Path(child, "metrics.jsonl").exists(), 30, "its start event")
    assert start_value(child) == "new" and start_value(parent.run_dir) == "old"
    manifest = json.loads(Path(child, "manifest.json").read_text())
    assert manifest["parent"] == parent.run_id and manifest["code"]["source"] == str(source)
    [listed] = [r for r in await runs.list_runs(host) if r.run_id == manifest["run_id"]]
    assert listed.code_changed is True


async def test_R_on_a_host_that_ships_by_default_offers_the_code_here_for_a_run_of_its_own_trainer(tmp_path, box, sshd):
    """A host with `ship = true` (Watched.ship) and a run of the trainer installed there,
    launched before shipping was on: R offers the package here, every file new to the
    host, and the child runs it."""
    host, _ = box
    source = package(tmp_path, "shipped")
    # The host's own trainer (this checkout's, installed in the interpreter sshd runs).
    parent = await runs.launch(host, [str(sshd.python), "-m", "training", "train", "--synthetic", "--steps", "100000"])
    app = TracksideApp([Watched(host, smi="nvidia-smi-absent", ship=Delivery(source, str(sshd.python)))],
                       poll_interval=0.2, grace_s=5)  # fmt: skip
    async with app.run_test(size=(80, 24)) as pilot:
        key = f"gpu/{parent.run_id}"
        await open_run_when(pilot, key, lambda run: run.info.state is RunPhase.RUNNING, "the host's trainer's run")
        offer, _ = await ship_kill(pilot)
        assert offer.differing == [(f"{source} → gpu", ["A training/__init__.py", "A training/__main__.py",
                                                        "A training/value.py"])]  # fmt: skip
        [child_key] = await wait_for(pilot, lambda: children(app, parent), 60, "the relaunched run")
        child = await wait_for(pilot, lambda: app.runs[child_key].info.run_dir, 30, "its run dir")
        await wait_for(pilot, lambda: Path(child, "metrics.jsonl").exists(), 30, "its start event")
    assert start_value(child) == "shipped"
    assert json.loads(Path(child, "manifest.json").read_text())["code"]["source"] == str(source)


async def test_a_ship_that_fails_stops_nothing(tmp_path, box, sshd):
    host, full = box
    _, parent = await shipped_run(tmp_path, host, sshd.python)
    full.touch()  # the host's disk fills after the run was launched
    app = TracksideApp([Watched(host, smi="nvidia-smi-absent")], poll_interval=0.2, grace_s=5)
    told: list[str] = []
    notify = app.notify
    app.notify = lambda message, **kwargs: (told.append(str(message)), notify(message, **kwargs))[1]
    async with app.run_test(size=(80, 24)) as pilot:
        key = f"gpu/{parent.run_id}"
        await open_run_when(pilot, key, lambda run: run.info.state is RunPhase.RUNNING, "the shipped run")
        await ship_kill(pilot)
        said = await wait_for(pilot, lambda: [t for t in told if t.startswith("could not ship")], 30, "the ship's failure")
        assert said == [(f"could not ship to gpu, {key} left running: gpu: no room for training in {host.runs_root}/code: "
                         "it takes 0.0 MiB, 0.1 MiB free")], said  # fmt: skip
        assert not [t for t in told if t.startswith("stopping")] and not children(app, parent)
    [listed] = [r for r in await runs.list_runs(host) if r.run_id == parent.run_id]
    assert listed.state is RunPhase.RUNNING and listed.pids



async def test_R_syncs_a_foreign_trainers_directory_and_relaunches_its_command(tmp_path, box, sshd):
    """A trainer trackside did not write, launched with its directory synced: R offers the
    directory's changed files, and the child runs the same command over the new files."""
    host, _ = box
    work, place = work_dir(tmp_path), box_dir(tmp_path)
    sent = await Delivery(syncs=(SyncEntry(str(work), str(place)),)).send(host)
    await sent.put_in_place(host)
    parent = await runs.launch(host, [str(sshd.python), str(place / "train.py")], sent=sent)
    (work / "settings.py").write_text("VALUE = 'new'\n")
    app = TracksideApp([Watched(host, smi="nvidia-smi-absent")], poll_interval=0.2, grace_s=5)
    async with app.run_test(size=(80, 24)) as pilot:
        await open_run_when(pilot, f"gpu/{parent.run_id}", lambda run: run.info.state is RunPhase.RUNNING, "the run")
        offer, _ = await ship_kill(pilot)
        assert offer.differing == [(f"{work} → gpu:{place}", ["M settings.py"])]
        [child_key] = await wait_for(pilot, lambda: children(app, parent), 60, "the relaunched run")
        child = await wait_for(pilot, lambda: app.runs[child_key].info.run_dir, 30, "its run dir")
        await wait_for(pilot, lambda: "value=" in printed(child), 30, "its first line")
    assert "value=new" in printed(child) and "value=old" in printed(parent.run_dir)
    assert (place / "checkpoints/step-1/model.bin").read_text() == "host's"
