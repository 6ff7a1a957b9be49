"""Text a pane, a log, a manifest or a name carries, written as an attacker writes it: none
of its control sequences reaches the operator's terminal (a clipboard write, a title, a
reset, a screen of E's), what is parsed is what a terminal would show (a loss erased
before it was shown is in no curve), and a pane printing without end costs bounded
memory (issue 42)."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import time
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from textual.widgets import Log

from backends import sanitize
from backends.hosts import LocalHost
from backends.logs import panes, screen, streams
from backends.logs.console import ConsoleSummary
from backends.logs.logparse import Progress
from backends.runs import RunInfo, RunPhase
from tests.backends.test_foreign_runs import trackside
from tests.backends.test_runs import tmux_dir  # noqa: F401 (fixture)
from tests.tui.conftest import screen_text
from tests.waiting import wait_until
from tui.messages import ConsoleBatch, RunsListed
from scripts.sample import NOW, RUN_KEY, make_app, on_run

# What a terminal obeys: C0 but tab and newline, DEL, C1 (and ESC, which is C0).
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")

ATTACKS = {
    # The one-pass strip removed the CSI inside and so joined an OSC 52 that writes the clipboard.
    "nested OSC 52": "\x1b\x1b[0m]52;c;cHduZWQ=\x07",
    "nested in an OSC": "\x1b]0;\x1b]52;c;cHduZWQ=\x07\x07",
    "title": "\x1b]2;pwned\x9c",  # ended by the 8-bit ST
    "reset": "\x1bc",
    "screen of E's": "\x1b#8",
    "line-drawing set": "\x1b(0",
    "8-bit CSI and OSC": "\x9b2J\x9d0;pwned\x9c",
    "DCS and APC": "\x1bPq#0;2;0;0;0\x1b\\\x1b_apc\x1b\\",
}


def inert(text: str) -> bool:
    return not CONTROL.search(text)


@pytest.mark.parametrize("attack", ATTACKS.values(), ids=ATTACKS.keys())
def test_the_sanitizer_removes_each_attack_whole(attack):
    # What a terminal shows of it: the nested one's outer ESC is cut short by the CSI's,
    # so `]52;…` is text to a terminal, and shown as text.
    shown = "]52;c;cHduZWQ=" if attack == ATTACKS["nested OSC 52"] else ""
    assert sanitize.clean(f"before {attack}after") == f"before {shown}after"
    assert sanitize.line(f"a\n{attack}b") == f"a {shown}b"


@pytest.mark.parametrize("attack", ATTACKS.values(), ids=ATTACKS.keys())
def test_no_state_a_terminal_drew_holds_an_attack(attack):
    terminal = screen.Terminal()
    states = terminal.feed(f"step 3 {attack}\x1b(B loss=2.5\r\n")
    assert states and all(inert(s) for s in states), states


def test_text_drawn_in_the_line_drawing_set_is_not_read_as_words():
    said = ConsoleSummary()
    said.add_recorded("step 4 loss 2.5\n\x1b(0 step 5 loss 0.001 \x1b(B\n")
    said.settle()
    assert list(said.curve) == [(4, 2.5)]


@pytest.mark.parametrize(
    "drawn",
    [
        "step 5 loss 0.001 \x1b[11D\x1b[Kloss 2.5\r\n",  # back 11 columns, erased to the end, drawn over
        "step 5 loss 0.001\x08\x08\x08\x08\x08\x1b[K2.5\r\n",  # backspaces, erased
        "step 5 loss 0.001 \x1b[1G\x1b[2Kstep 5 loss 2.5\r\n",  # to column 1, the line erased
        "step 4 \x1b[8mloss 0.001\x1b[0m\r\nstep 5 loss 2.5\r\n",  # concealed: drawn as blanks
    ],
    ids=["CUB+EL", "BS+EL", "CHA+EL2", "concealed"],
)
def test_a_loss_erased_before_it_was_shown_is_in_no_curve(drawn):
    said = ConsoleSummary()
    said.add_recorded(drawn)
    said.settle()
    assert list(said.curve) == [(5, 2.5)]


def test_a_sequence_cut_short_by_another_draws_and_moves_nothing():
    assert screen.Terminal().feed("ab\r\ncd\x1b[\x1b[0mef\x1b[3\x1b[1mgh\r\n") == ["ab", "cdefgh"]


def test_rows_wrap_at_a_known_width_and_a_carriage_return_goes_to_the_rows_start():
    terminal = screen.Terminal(width=10)
    assert terminal.feed("0123456789abcdef\rXY\r\n") == ["0123456789abcdef", "0123456789XYcdef"]
    assert screen.Terminal().feed("0123456789abcdef\rXY\r\n") == ["0123456789abcdef", "XY23456789abcdef"]


def test_a_line_past_the_cap_is_cut_counted_and_marked():
    terminal = screen.Terminal()
    [state] = terminal.feed("loss=" + "1" * 10_000 + "\n")
    assert len(state) == sanitize.LINE_CAP + 1 and state.endswith("…")
    assert terminal.cut == 10_005 - sanitize.LINE_CAP
    said = ConsoleSummary()
    said.add_recorded("step=1 loss=" + "1" * 10_000 + "\n")  # its number cut short: not read
    assert said.loss is None and screen.visible_text("loss=" + "1" * 10_000).endswith("1…")


def test_a_pane_printing_no_newline_costs_bounded_memory():
    """Newline-free output folded as a recording reads it, 1 MiB at a time (the pending
    bytes once held all of it)."""
    tape = panes._Tape(ConsoleSummary())
    chunk = b"x" * (1 << 20)
    started = time.process_time()
    tracemalloc.start()
    try:
        for _ in range(24):
            panes.Recordings._fold(tape, chunk)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"{peak / 2**20:.0f} MiB for 24 MiB of output"
    assert time.process_time() - started < 20  # each read's cost its own, not all before it


async def test_following_a_file_without_newlines_holds_a_bounded_line(tmp_path):
    path = tmp_path / "console.log"
    path.write_bytes(b"x" * (4 << 20) + b"\nstep=1 loss=2\n")
    host = LocalHost(runs_root=str(tmp_path))
    lines = []

    async def read() -> None:
        async for line in streams.follow(host, str(path)):
            lines.append(line)
            if len(lines) == 2:
                return

    await asyncio.wait_for(read(), 120)
    assert len(lines[0].text) == streams.LINE_BYTES + 1 and lines[0].text.endswith("…")
    assert [line.end_offset for line in lines] == [(4 << 20) + 1, path.stat().st_size]
    assert lines[1].text == "step=1 loss=2"


# --- through the command line, from a real pane -------------------------------------------


@pytest.fixture
def config(tmp_path, runs_root, tmux_dir):  # noqa: F811
    path = tmp_path / "config.toml"
    path.write_text(f"[hosts.box]\nruns_root = {json.dumps(runs_root)}\n")
    return str(path)


LABEL = "".join(ATTACKS.values()).replace("\x1b(0", "\x1b(0lqk\x1b(B")  # every attack in a bar's label


def test_trackside_runs_prints_no_attack_and_no_erased_loss(config, tmp_path):
    """A pane that prints, once trackside records it, a loss erased by cursor moves and a
    bar whose label holds every attack: the table and the JSON show what a terminal
    shows, and no control."""
    go = tmp_path / "go"
    printed = tmp_path / "printed"
    printed.write_bytes(
        (
            "step 5 loss 0.001 \x1b[11D\x1b[Kloss 2.5\r\n"
            f"{LABEL}train  50%|#####     | 5/10 [00:05<00:05,  1.00it/s]\r\n"
        ).encode()
    )
    wait = f'while [ ! -e "{go}" ]; do sleep 0.05; done; cat "{printed}"; sleep 600'
    subprocess.run(["tmux", "new-session", "-d", "-s", "hostile", "sh", "-c", wait], check=True)
    first = trackside("runs", "--json", "--config", config)  # starts the pane's recording
    assert first.returncode == 0, first.stderr
    go.touch()
    deadline = time.monotonic() + 120
    while True:
        done = trackside("runs", "--json", "--config", config)
        [run] = [r for r in json.loads(done.stdout) if r["session"] == "hostile"]
        if run["last_loss"] is not None and run.get("progress") or time.monotonic() > deadline:
            break
    assert run["last_loss"] == 2.5 and run["last_step"] == 5
    assert inert(done.stdout) and all(inert(s) for s in _strings(json.loads(done.stdout)))
    # What a terminal leaves of the label: the 8-bit CSI's erase (ED 2) took what the others drew before it.
    assert run["progress"]["label"] == "train" and "pwned" not in done.stdout
    table = trackside("runs", "--config", config)
    assert table.returncode == 0 and inert(table.stdout), table.stdout
    assert "0.001" not in table.stdout and "2.5" in table.stdout


def _strings(doc):
    if isinstance(doc, str):
        yield doc
    elif isinstance(doc, dict):
        for key, value in doc.items():
            yield key
            yield from _strings(value)
    elif isinstance(doc, list):
        for value in doc:
            yield from _strings(value)


# --- through the dashboard ------------------------------------------------------------------


async def test_the_run_screens_log_stats_and_notifications_draw_no_attack():
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await on_run(pilot)
        lines = [f"{attack}step 9 loss=1.5" for attack in ATTACKS.values()]
        app.post_message(ConsoleBatch("h200-box", RUN_KEY, lines))
        hostile = RunInfo(None, f"s{LABEL}", "h200-box", RunPhase.RUNNING, pids=[5],
                          progress=Progress("training", 5, 10, None, f"{LABEL}train"))  # fmt: skip
        app.post_message(RunsListed("h200-box", [app.runs[RUN_KEY].info, hostile], NOW))
        await pilot.pause(0.3)
        drawn = app.screen.query_one(Log).lines[-len(lines) :]
        assert all(inert(line) for line in drawn), drawn
        assert all(line.endswith("step 9 loss=1.5") for line, name in zip(drawn, ATTACKS) if name != "line-drawing set"), drawn
        assert inert(screen_text(app))
        app.open_run(f"h200-box/s{LABEL}")  # its stats: its session's name, its bar's label
        app.notify(f"{LABEL}[bold]not markup[/bold]", title=LABEL)
        await pilot.pause(0.3)
        shown = screen_text(app)
        assert "train" in shown and inert(shown), repr(CONTROL.findall(shown))
        [note] = list(app._notifications)[-1:]
        assert inert(note.message + note.title) and "[bold]" in note.message and not note.markup


# --- properties: random, huge and pathological text, under a time budget ------------------

relaxed = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=300)
anything = st.text(st.characters(codec=None, blacklist_categories=()), max_size=400)
escapes = st.lists(
    st.sampled_from(["\x1b", "[", "]", "\x07", "\\", "\x9b", "\x9d", "\x9c", "\r", "\n", "\x08", "\t", ";", "0", "9", "A",
                     "D", "K", "J", "m", "c", "#", "8", "(", "P", "_", "\x18", "x", " ", "é", "\ud800"]),  # fmt: skip
    max_size=300,
).map("".join)


@relaxed
@given(st.one_of(anything, escapes))
def test_the_sanitizer_leaves_no_control_and_is_stable(text):
    cleaned = sanitize.clean(text)
    assert inert(cleaned.replace("\n", "")) and "\n" not in cleaned
    assert sanitize.clean(cleaned) == cleaned
    assert not re.search(r"[\ud800-\udfff]", cleaned)
    cleaned.encode()  # encodable: no lone surrogate


@relaxed
@given(st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp", "Cf")), max_size=200))
def test_printable_text_is_left_as_it_is(text):
    assert sanitize.clean(text) == text
    assert screen.visible_text(text) == text.rstrip()[: sanitize.LINE_CAP] + ("…" if len(text) > sanitize.LINE_CAP else "")


@relaxed
@given(st.one_of(anything, escapes), st.lists(st.integers(0, 400), max_size=6))
def test_the_terminal_draws_only_text_and_the_same_however_its_bytes_arrive(text, cuts):
    whole = screen.Terminal()
    states = whole.feed(text) + whole.flush()
    pieces = screen.Terminal()
    got, last = [], 0
    for cut in sorted(cuts):
        got += pieces.feed(text[last:cut])
        last = max(last, cut)
    got += pieces.feed(text[last:]) + pieces.flush()
    assert got == states
    assert all(inert(s) and len(s) <= sanitize.LINE_CAP + 1 for s in states)


HUGE = {
    "plain": "x" * (4 << 20),
    "escapes opened": "\x1b[" * (1 << 20),
    "strings opened": "\x1b]" * (1 << 20),
    "8-bit strings": "\x9d" * (2 << 20),
    "moves and text": "a\x1b[D" * (1 << 19),
    "backspaces": "ab\x08" * (1 << 20),
    "ups and downs": "x\x1b[99999A\x1b[99999B\n" * (1 << 16),
    "long params": "\x1b[" + "9" * (2 << 20) + "m",
    "redraws": "\r 50%|█████     | 5/10 [00:05<00:05]" * (1 << 16),
}


@pytest.mark.parametrize("text", HUGE.values(), ids=HUGE.keys())
def test_huge_and_pathological_text_takes_linear_time(text):
    started = time.process_time()
    cleaned = sanitize.clean(text)
    terminal = screen.Terminal()
    states = [s for start in range(0, len(text), 1 << 16) for s in terminal.feed(text[start : start + (1 << 16)])]
    states += terminal.flush()
    elapsed = time.process_time() - started
    assert inert(cleaned) and all(inert(s) and len(s) <= sanitize.LINE_CAP + 1 for s in states)
    assert elapsed < 20, f"{len(text) / 2**20:.1f} MiB in {elapsed:.1f} s of CPU"
