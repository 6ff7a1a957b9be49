"""Render the real app to screenshots/: the run screen mid-training, the fleet (with a run
trackside did not launch and the dashboard's own session), that foreign run's screen, the
kill dialog, the refused self-kill, R's offer to ship the code here, the edit form and a DFlash run's screen, as SVG (and
PNG when cairosvg is installed).

    .venv/bin/python scripts/screenshots.py [NAME…]    (default: every one)
    .venv/bin/python scripts/screenshots.py --replay HOST RUNS_ROOT RUN AT…   (a real run's past)

The data are the snapshot tests' fixed fleet (scripts/sample.py), fed as monitor
messages, with the llama3-8b drafter shape so the edit form predicts memory.
"""

from __future__ import annotations

import asyncio
import html
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from training.config import PRESETS  # noqa: E402
from scripts.sample import FOREIGN_KEY, RUN_KEY, feed_foreign, kill_plan, make_app  # noqa: E402
from tui.screens.edit import EditScreen  # noqa: E402
from tui.screens.kill import KillConfirm  # noqa: E402
from tui.screens.ship import ShipRelaunch  # noqa: E402

OUT = REPO / "screenshots"
SIZE = (160, 48)
NARROW_SIZE = (80, 24)


async def shoot(wanted) -> list[Path]:
    app = make_app()
    saved = []

    def save(name: str) -> None:
        if name in wanted:
            saved.append(Path(app.save_screenshot(f"{name}.svg", str(OUT))))

    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await feed_foreign(pilot, model=PRESETS["llama3-8b"].to_dict())
        save("fleet")
        app.open_run(FOREIGN_KEY)
        await pilot.pause()
        save("foreign-run")
        app.pop_screen()
        await pilot.pause()
        table = app.screen.query_one("DataTable")
        table.move_cursor(row=[key.value for key in table.rows].index("run:h200-box/ops"))
        app.clear_notifications()
        await pilot.press("k")  # the dashboard's own session: refused, with the reason
        await pilot.pause(0.5)  # the toast slides in
        save("self-kill-refused")
        app.clear_notifications()
        app.open_run(RUN_KEY)
        await pilot.pause()
        save("run")
        app.push_screen(KillConfirm(RUN_KEY, kill_plan()))
        await pilot.pause()
        save("kill")
        app.pop_screen()
        # R on a run whose training package here differs from the code it runs (README's
        # loop: fix here, R, watch the first steps); the files echo the design story's
        # chunked soft-KL fix.
        app.push_screen(ShipRelaunch(RUN_KEY, [("~/src/trackside/training → h200-box",
                                                ["M training/dflash/loss.py", "M training/loss.py"])]))
        await pilot.pause()
        save("ship-relaunch")
        app.pop_screen()
        run = app.runs[RUN_KEY]
        form = EditScreen(run, app.hosts[run.host], {"max_seq_len": 98304, "ttt_steps": 5})
        app.push_screen(form)
        await pilot.pause()
        while not form.cost_is_current:  # predicted in a worker thread
            await pilot.pause(0.05)
        save("edit")
    return saved


def to_png(svgs: list[Path]) -> bool:
    try:
        import cairosvg
    except ImportError:
        return False
    for svg in svgs:
        # Textual's SVG asks for Fira Code from the web; cairosvg cannot fetch it, and its
        # stand-in for bold Fira Code is a proportional bold, wider than the cells, whose
        # text ran into the next ("≈177.6 GiBof 140 GiB"). Bold text is drawn in DejaVu
        # Sans Mono, whose bold keeps the cell width (not all text: it has no braille,
        # which the charts are drawn in).
        text = svg.read_text().replace("font-weight: bold }", "font-weight: bold; font-family: DejaVu Sans Condensed }")
        text = LEADING_SPACES.sub(_indent_by_x, text)
        cairosvg.svg2png(bytestring=text.encode(), write_to=str(svg.with_suffix(".png")))
    return True


# A run of text that starts with blank cells (an indented continuation line). cairosvg
# draws each no-break space narrower than a cell, so such a line sat left of the column it
# continues (the kill dialog's GPUs); its blanks become a move of its x instead.
LEADING_SPACES = re.compile(r'x="([0-9.]+)"( y="[0-9.]+") textLength="([0-9.]+)"([^>]*)>((?:&#160;)+)([^<]*)<')


def _indent_by_x(match: re.Match) -> str:
    x, y, length, rest, blanks, after = match.groups()
    cells = blanks.count("&#160;") + len(html.unescape(after))
    shift = float(length) * blanks.count("&#160;") / cells
    return f'x="{float(x) + shift:g}"{y} textLength="{float(length) - shift:g}"{rest}>{after}<'


NAMES = ("fleet", "foreign-run", "self-kill-refused", "run", "kill", "ship-relaunch", "edit", "plot", "run-lineage", "dflash-run",
         "fleet-80x24", "edit-80x24", "replay", "replay-80x24")


def main(argv: list[str]) -> int:
    if argv[:1] == ["--replay"]:
        return replay_real(argv[1:])
    wanted = set(argv) or set(NAMES)
    unknown = wanted - set(NAMES)
    if unknown:
        print(f"no screenshot named {', '.join(sorted(unknown))} (known: {', '.join(NAMES)})", file=sys.stderr)
        return 2
    OUT.mkdir(exist_ok=True)
    svgs = asyncio.run(shoot(wanted))
    if "run-lineage" in wanted:
        svgs.append(asyncio.run(lineage_svg()))
    if "dflash-run" in wanted:
        svgs.append(asyncio.run(dflash_svg()))
    if wanted & {"fleet-80x24", "edit-80x24"}:
        svgs += asyncio.run(narrow_svgs(wanted))
    if wanted & {"replay", "replay-80x24"}:
        svgs += asyncio.run(sample_replay_svgs(wanted))
    pngs = to_png(svgs)
    for svg in svgs:
        print(svg.relative_to(REPO), "(+ .png)" if pngs else "")
    if not pngs:
        print("PNG skipped: pip install cairosvg to make them", file=sys.stderr)
    if "plot" in wanted:
        print(plot_text().relative_to(REPO))
    return 0


def plot_text() -> Path:
    """`trackside plot` of the sample run and its TTT 3 → 5 relaunch, as a pipe receives it."""
    import contextlib
    import io
    import tempfile

    from tui.commands.plot import main as plot_main
    from scripts.sample import CHILD_ID, RUN_ID, write_lineage

    with tempfile.TemporaryDirectory() as tmp:
        write_lineage(Path(tmp, "runs"))
        config = Path(tmp, "config.toml")
        config.write_text(f'[hosts.h200-box]\nruns_root = "{Path(tmp, "runs")}"\n')
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            plot_main([RUN_ID, CHILD_ID, "--config", str(config), "--width", "100", "--height", "24"])
    path = OUT / "plot.txt"
    lines = [f"$ trackside plot {RUN_ID} {CHILD_ID} --width 100 --height 24", *printed.getvalue().splitlines()]
    path.write_text("".join(line.rstrip() + "\n" for line in lines))  # plotext pads its lines
    return path


async def lineage_svg() -> Path:
    """The sample run's TTT 3 → 5 relaunch on its run screen, its parent drawn dim behind
    it, read from run dirs by the app's worker as on a live host."""
    import tempfile

    from backends.hosts import LocalHost
    from backends.runs import RunPhase
    from tui.app import TracksideApp, Watched
    from tui.messages import GpusPolled, MetricsBatch, RunsListed
    from scripts.sample import CHILD_ID, CHILD_PARAMS, NOW, child_metrics_events, frozen_clock, gpus, run_info, write_lineage

    with tempfile.TemporaryDirectory() as tmp:
        write_lineage(Path(tmp))
        app = TracksideApp([Watched(LocalHost("h200-box", runs_root=tmp))], monitor=False, clock=frozen_clock)
        parent = run_info(RunPhase.EXITED)
        child = run_info()
        child.run_id, child.params, child.parent, child.run_dir = CHILD_ID, dict(CHILD_PARAMS), parent.run_id, f"{tmp}/{CHILD_ID}"
        key = f"h200-box/{CHILD_ID}"
        async with app.run_test(size=SIZE) as pilot:
            app.post_message(RunsListed("h200-box", [child, parent], NOW))
            app.post_message(GpusPolled("h200-box", gpus(), NOW))
            app.post_message(MetricsBatch("h200-box", key, child_metrics_events(), garbled=0))
            await pilot.pause()
            app.open_run(key)
            while not app.runs[key].overlays:  # read by the app's worker
                await pilot.pause(0.05)
            await pilot.pause(0.6)  # the chart replots at most twice a second
            path = Path(app.save_screenshot("run-lineage.svg", str(OUT)))
    return path


async def narrow_svgs(wanted) -> list[Path]:
    """The fleet and the edit form as an 80×24 terminal shows them: the columns an operator
    needs uncut, and a value typed wrong with its error in sight over Keep."""
    from textual.widgets import Input

    app, saved = make_app(), []
    async with app.run_test(size=NARROW_SIZE, notifications=True) as pilot:
        await feed_foreign(pilot, model=PRESETS["llama3-8b"].to_dict())
        if "fleet-80x24" in wanted:
            saved.append(Path(app.save_screenshot("fleet-80x24.svg", str(OUT))))
        if "edit-80x24" in wanted:
            app.clear_notifications()  # the alerts' toasts time out; the alert bar keeps them
            app.open_run(RUN_KEY)
            await pilot.pause()
            run = app.runs[RUN_KEY]
            form = EditScreen(run, app.hosts[run.host], {})
            app.push_screen(form)
            await pilot.pause()
            form.query_one("#param-max_seq_len", Input).focus()
            await pilot.press("ctrl+a", "ctrl+k", *"32k")
            await pilot.pause()
            saved.append(Path(app.save_screenshot("edit-80x24.svg", str(OUT))))
    return saved


async def dflash_svg() -> Path:
    """A DFlash run beside the sample run (scripts/sample.py): its loss at block positions
    1, 8 and 15 beside the total, and τ by the legend and in the stats."""
    from scripts.sample import on_dflash_run

    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await on_dflash_run(pilot)
        return Path(app.save_screenshot("dflash-run.svg", str(OUT)))


async def replay_svgs(history, times: list[float], names: list[str], size: tuple[int, int]) -> list[Path]:
    """`trackside replay`'s screen of `history` at each of `times`, saved as each of `names`."""
    from backends.history import moments_of
    from tui.replay import ReplayApp

    app, saved = ReplayApp(history, moments_of(history), times[0]), []
    async with app.run_test(size=size) as pilot:
        for when, name in zip(times, names):
            app.screen.go(when)
            await pilot.pause(0.6)  # the chart replots at most twice a second
            saved.append(Path(app.save_screenshot(f"{name}.svg", str(OUT))))
    return saved


async def sample_replay_svgs(wanted) -> list[Path]:
    """The sample run's past (scripts/sample.py) at its skipped step, and at 80×24 inside
    the recorder's gap."""
    from scripts.sample import T0, replay_history

    saved = []
    if "replay" in wanted:
        saved += await replay_svgs(replay_history(), [T0 + 511.0], ["replay"], SIZE)
    if "replay-80x24" in wanted:
        saved += await replay_svgs(replay_history(), [T0 + 430.0], ["replay-80x24"], NARROW_SIZE)
    return saved


def replay_real(argv: list[str]) -> int:
    """`--replay HOST RUNS_ROOT RUN AT…`: a real run's past (a run dir and the GPU
    recording brought back from HOST into RUNS_ROOT; the screens name HOST) at each AT
    (`trackside replay --at`'s times), saved as replay-1.svg, replay-2.svg, …"""
    from backends.history import parse_when
    from backends.history.read import read_history
    from backends.hosts import LocalHost

    if len(argv) < 4:
        print("usage: screenshots.py --replay HOST RUNS_ROOT RUN AT [AT…]", file=sys.stderr)
        return 2
    host, root, run, ats = argv[0], argv[1], argv[2], argv[3:]
    history = asyncio.run(read_history(LocalHost(host, runs_root=root), run))
    times = [parse_when(at, history.start, history.end) for at in ats]
    OUT.mkdir(exist_ok=True)
    svgs = asyncio.run(replay_svgs(history, times, [f"replay-{k}" for k in range(1, len(times) + 1)], SIZE))
    to_png(svgs)
    for svg in svgs:
        print(svg.relative_to(REPO))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
