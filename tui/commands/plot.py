"""`trackside plot RUN [RUN…]`: runs' curves drawn with plotext in the plain terminal.

For a shell, a CI log or a chat paste: no Textual, one chart on stdout, a panel per metric
asked. Colours only on a terminal; elsewhere each run has its own marker, so the curves stay
apart in plain text. The legend is under the chart, not in its frame, where it would hide
whatever curve passes under it (a short run's, in the top left corner).

Exit status: 0 drawn, 2 a bad argument or a metric or x axis a run never logged, 1 a run
or host that cannot be reached or found; a one-line message, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys

import plotext as plt

from backends import runs, sanitize, tmux
from backends.config import ConfigError, load_config
from backends.hosts import HostError
from backends.logs import series
from training.contract import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    RUN_ID_EXAMPLE,
    UsageError,
)
from tui.commands.shared import Parser

MARKERS = ["•", "+", "x", "o", "*", "#"]  # one per run when there is no colour to tell them apart
COLORS = ["blue+", "green+", "red+", "cyan+", "magenta+", "yellow"]  # one per run, in every panel and the legend
DEFAULT_METRIC = "loss"
PANEL_LINES = 7  # a panel's title, frame, x ticks and 3 rows of curves


def _size(text: str) -> int:
    if not text.isdigit() or not 10 <= int(text) <= 1000:
        raise argparse.ArgumentTypeError(f"expected a number of cells from 10 to 1000, got {text!r}")
    return int(text)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = Parser(prog="trackside plot", description="Runs' curves in the plain terminal, each run named in the legend.")
    parser.add_argument("runs", nargs="+", metavar="RUN", help="a run id, or the tmux session of a run trackside did not launch")
    parser.add_argument("--host", help="a host of the config file (default: its first host; without one, this machine)")
    parser.add_argument("--config", metavar="PATH", help="config file (default ~/.config/trackside/config.toml)")
    parser.add_argument("--metric", action="append", help="a step event's number: loss, acc (first TTT step's), tokens_per_s, lr, tau, …, or one curve of the run screen's chart: 'pos K' (a DFlash block position's loss), 'ttt K' (a TTT step's) (default loss); repeat it for a panel per metric")
    parser.add_argument("--x", default="step", choices=series.X_AXES, help="step, tokens seen, or seconds since the start (default step)")
    parser.add_argument("--width", type=_size, help="cells (default: the terminal's width)")
    parser.add_argument("--height", type=_size, help="lines (default: 25, or the terminal's height if less)")
    parser.add_argument("--json", action="store_true", help="print the series instead of the chart")
    args = parser.parse_args(argv)
    args.metric = list(dict.fromkeys(args.metric or [DEFAULT_METRIC]))  # in the order given, once each
    for run in args.runs:
        if not runs.RUN_ID.fullmatch(run) and not tmux.is_session_name(run):
            raise UsageError(f"trackside plot: RUN {run!r} is neither a run id (like {RUN_ID_EXAMPLE}) nor a tmux session name")
    return args


async def read(args) -> list[series.Series]:
    config = load_config(args.config)
    host = (config.host(args.host) if args.host else config.hosts[0]).make_host()
    try:
        # Session names need the listing (the newest run of a name); run ids do not.
        named = [r for r in args.runs if not runs.RUN_ID.fullmatch(r)]
        listed = await runs.list_runs(host) if named else []
        return [await series.of_target(host, target, listed) for target in args.runs]
    finally:
        await host.close()


def label(s: series.Series, plotted: dict[str, series.Series]) -> str:
    """The run's name, and what it changed when its parent is plotted beside it."""
    parent = plotted.get(s.parent or "")
    return f"{s.name} ({series.changed(parent.params, s.params, parent.code, s.code)})" if parent else s.name


def chart(names: list[str], panels: list[tuple[str, list[list[tuple[float, float]]]]], x: str, width: int, height: int, color: bool) -> str:
    """A panel per (metric, each run's points), the runs' `names` under them."""
    marks = [(COLORS[k % len(COLORS)], MARKERS[k % len(MARKERS)]) for k in range(len(names))]
    legend = [f" {plt.colorize('••', hue) if color else mark * 2} {name[: width - 4]}" for name, (hue, mark) in zip(names, marks)]
    plt.main()  # plotext's figure is global, and the last call left a panel of it active
    plt.clear_figure()
    plt.limit_size(False, False)  # the size asked for, not the terminal's (none, in a pipe)
    plt.plot_size(width, max(1, height - len(legend)))
    plt.subplots(len(panels), 1)
    for row, (metric, curves) in enumerate(panels, 1):
        plt.subplot(row, 1)
        plt.theme("pro" if color else "clear")
        for points, (hue, mark) in zip(curves, marks):
            xs, ys = zip(*points)
            plt.plot(xs, ys, **({"color": hue} if color else {"marker": mark}))
        plt.title(f"{metric} against {x}")
    plt.xlabel({"tokens": "tokens seen", "time": "seconds", "point": "printed point (no step printed)"}.get(x, x))  # under the last panel: they share it
    drawn = plt.build().rstrip("\n")
    return "\n".join([drawn if color else plt.uncolorize(drawn), *legend])


def main(argv: list[str]) -> int:
    failures: dict[type, int] = {
        UsageError: EXIT_USAGE, ConfigError: EXIT_USAGE, series.SeriesError: EXIT_USAGE, HostError: EXIT_FAILURE, runs.RunError: EXIT_FAILURE,
    }
    try:
        args = parse_args(argv)
        read_series = asyncio.run(read(args))
        plotted = {s.name: s for s in read_series}
        panels = [(metric, [s.curve(metric, args.x) for s in read_series]) for metric in args.metric]
    except tuple(failures) as e:
        code = next(c for kind, c in failures.items() if isinstance(e, kind))
        print(sanitize.block(str(e) if isinstance(e, UsageError) else f"trackside plot: {e}"), file=sys.stderr)
        return code
    if args.json:
        doc = [
            {"run": s.name, "host": s.host, "parent": s.parent, "params": s.params, "metric": metric,
             "x": s.axis if args.x == "step" else args.x,  # a console's steps may be rounds, or printed points
             "points": [list(p) for p in curves[k]]}
            for k, s in enumerate(read_series) for metric, curves in panels
        ]  # fmt: skip
        print(json.dumps(sanitize.value(doc), indent=1))
        return EXIT_OK
    columns, lines = shutil.get_terminal_size((100, 30))
    width, height = args.width or columns, args.height or max(10, min(25, lines - 1))
    names = [sanitize.line(label(s, plotted)) for s in read_series]  # a run's name and params are anyone's
    need = len(panels) * PANEL_LINES + 1 + len(names)  # the panels, the x axis's name, the legend
    if height < need:
        print(f"trackside plot: this chart needs --height {need} or more (a panel per metric, a legend line per run)", file=sys.stderr)
        return EXIT_USAGE
    counts = {s.axis for s in read_series} if args.x == "step" else {args.x}
    x = counts.pop() if len(counts) == 1 else "step, round or printed point"  # runs of several kinds share the axis
    print(chart(names, panels, x, width, height, color=sys.stdout.isatty()))
    return EXIT_OK
