"""Every console fixture played back into a real 80×24 tmux pane, and read as an operator
reads it: `trackside runs --json` and the session's curve (what `plot` and the run screen
draw), compared with the library's own record (tests/fixtures/consoles/*.json).

Read right or not at all: no field may be wrong; a field left blank where the record has a
value is allowed only where BLANK says so (docs/testing.md lists them), so reading less is
a regression too. Two ways in, as trackside meets a session: its output printed before
trackside first saw the pane (read from the scrollback, capture-pane), and printed after
(read from the pane's recording, every byte tmux's pipe-pane got).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import pytest

from backends.hosts import LocalHost
from backends.logs import panes
from backends.logs.console import ConsoleSummary
from tests.backends.test_formats import FIXTURES, NAMES, shown_as, truth
from tests.backends.test_runs import PY, tmux_dir  # noqa: F401 (fixture)

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "testing.md"
FIELDS = ("last_step", "last_loss", "eval_loss")
# fixture: the fields it leaves blank though its library recorded them, and why
BLANK = {
    "deepspeed-engine-cpu": {"last_step"},  # `step=40` and `Loss:` are separate lines: which step a loss was is not said
    "lightning-2.6.6-tqdm": {"eval_loss"},  # at 80 columns its postfix cuts val_loss short
    "torch-2.13-mnist-example": {"last_step"},  # it prints samples seen (`[640/2560]`), not steps
    "torch-2.13-quickstart": {"last_step"},
    "fabric-2.6-mnist-example": {"last_step"},
    "transformers-5.25-datasets-notqdm": {"last_step"},  # disable_tqdm: its dicts name no step
    "xgboost-3.2-sklearn": {"last_loss", "eval_loss"},  # validation_0 and _1: which is the training data is not said
    "composer-0.32-progress-bar": {"last_loss", "eval_loss"},  # Composer cuts its bars at the terminal's width: the postfix never printed
    "ultralytics-8.4-yolo": {"last_loss", "eval_loss"},  # three losses (box, cls, dfl), no total; its validation prints none
}


def recorded(name: str) -> dict[str, object]:
    """What the library's record says each field should be."""
    doc = truth(name)
    return {
        "last_step": doc["last_step"],
        "last_loss": doc["train"][-1][1] if doc["train"] else None,
        "eval_loss": [v for s, v in doc["eval"] if s == doc["eval"][-1][0]] if doc["eval"] else None,
    }


def wrong_and_blank(name: str, run: dict) -> tuple[list[str], set[str]]:
    true = recorded(name)
    wrong, blank = [], set()
    for field in FIELDS:
        read, should = run[field], true[field]
        if read is None:
            blank |= {field} if should is not None else set()
        elif should is None:
            wrong.append(f"{field} {read!r}: the record has none")
        elif field == "last_step" and read != should:
            wrong.append(f"last_step {read} of {should}")
        elif field == "eval_loss" and not any(shown_as(read, v) for v in should):
            wrong.append(f"eval_loss {read} of {should}")
        elif field == "last_loss" and not shown_as(read, should):
            wrong.append(f"last_loss {read} of {should}")
    return wrong, blank


def curve_wrong(name: str, said: ConsoleSummary) -> list:
    """Points of the session's curves (what `plot` and the run screen draw) that are not the
    library's at that x, and their axis if it is not what the library's record counts (or
    `point`: nothing printed a step). Records from before the truth said its x count steps."""
    doc = truth(name)
    bad = [] if said.axis in (doc.get("x", "step"), "point") else [("axis", said.axis, "of", doc["x"])]
    for metric, points, read in (("loss", doc["train"], said.curve), ("eval_loss", doc["eval"], said.eval_curve)):
        if said.axis == "point":  # no step printed: the losses in order
            values = iter(v for _, v in points)
            bad += [(x, v) for x, v in read if not any(shown_as(v, t) for t in values)]
            continue
        true: dict[int, list[float]] = {}
        for x, v in points:
            true.setdefault(x, []).append(v)
        bad += [(metric, x, v) for x, v in read if not any(shown_as(v, t) for t in true.get(x, []))]
    return bad


def tmux(*argv: str) -> None:
    subprocess.run(["tmux", *argv], check=True, timeout=60)


def listing(config: str) -> dict[str, dict]:
    done = subprocess.run([PY, "-m", "tui.cli", "runs", "--json", "--config", config], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert done.returncode == 0, done.stderr
    return {run["session"]: run for run in json.loads(done.stdout)}


@pytest.fixture
def config(tmp_path, runs_root, tmux_dir):  # noqa: F811
    path = tmp_path / "config.toml"
    path.write_text(f"[hosts.box]\nruns_root = {json.dumps(runs_root)}\n")
    return str(path)


@pytest.mark.parametrize("way", ["scrollback", "recording"])
def test_every_fixture_replayed_in_a_pane_reads_right_or_blank(config, runs_root, way):
    """Each fixture's bytes `cat` into its own 80×24 pane (session `r<k>`), after the first
    listing (recording) or before it (scrollback); then one listing reads them all."""
    sessions = {f"r{k}": name for k, name in enumerate(NAMES)}
    for session, name in sessions.items():
        # a channel per pane: tmux keeps one signal for a waiter not there yet, not one for each
        play = f'tmux wait-for go-{session}; cat "$1"; tmux wait-for -S played-{session}; exec sleep 600'
        if way == "scrollback":
            play = f'cat "$1"; tmux wait-for -S played-{session}; exec sleep 600'
        tmux("new-session", "-d", "-s", session, "-x", "80", "-y", "24", "sh", "-c", play, "sh", str(FIXTURES / f"{name}.raw"))
    if way == "recording":
        assert set(listing(config)) >= set(sessions)  # seen, so recorded from here on
        for session in sessions:
            tmux("wait-for", "-S", f"go-{session}")
    for session in sessions:
        tmux("wait-for", f"played-{session}")
    listed = listing(config)
    host = LocalHost(runs_root=runs_root)
    report, blanks = {}, {}
    for session, name in sessions.items():
        run = listed[session]
        wrong, blank = wrong_and_blank(name, run)
        wrong += [f"curve point {p}" for p in curve_wrong(name, asyncio.run(panes.read_session(host, session)).summary)[:3]]
        assert run["state"] == "running", name
        if wrong:
            report[name] = wrong
        if blank:
            blanks[name] = blank
    assert report == {}, "read wrong"
    if way == "recording":  # the scrollback keeps less (a bar's last state only): more may be blank there
        assert blanks == BLANK


def test_docs_list_the_fields_left_blank():
    """docs/testing.md's table of blank fields is BLANK's, fixture by fixture, and its count
    of them is theirs, of the fields the fixtures' libraries recorded."""
    text = DOC.read_text()
    rows = [line.split("|") for line in text.splitlines() if line.startswith("| `") and "blank:" in line]
    fields = [cells[2].split("blank:")[1].split("(")[0] for cells in rows]  # `a`, `b` (why)
    listed = {cells[1].strip().strip("`"): {f.strip().strip("`") for f in said.split(",")} for cells, said in zip(rows, fields)}
    assert listed == BLANK
    recorded_fields = sum(recorded(name)[field] is not None for name in NAMES for field in FIELDS)
    counted = f"Blank: **{sum(map(len, BLANK.values()))} fields of {len(BLANK)} fixtures**, of the {recorded_fields} fields the {len(NAMES)} fixtures'"
    assert counted in " ".join(text.split()), counted
