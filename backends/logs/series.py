"""A run's curves: its step records read whole, as `trackside plot` and the run screen's
overlays draw them.

A run trackside launched is read from its run dir: metrics.jsonl's step events, or, for a
program that writes none, its console.log folded by `backends.logs.console`. A tmux session it
did not launch is read from its pane's scrollback through the same fold, so it has a loss
against steps and nothing else. Files are read by `runs.read_file`: a missing one is no
curve, one that cannot be read a RunError naming it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from backends import runs
from backends.hosts import Host
from backends.logs import console, panes
from backends.logs.logparse import parse_metrics_line
from training.contract import START, STEP

X_AXES = ("step", "tokens", "time")
# Metrics named by what an operator asks for: the accuracy of the first drafted token
# (EAGLE-3's TTT step 0, a DFlash block's first position), as the trainer prints acc_0.
ALIASES = {"acc": ("acc_ttt", "acc_pos")}
ANCESTORS = 2  # parent and grandparent: further back, the tweak being judged is lost
# One part of a run's loss, as the run screen's chart names its curves: a DFlash block
# position's (`pos 8`: loss_pos, counted from 1, the anchor's next token, as the trainer's
# weights count) or an EAGLE-3 TTT step's (`ttt 2`: loss_ttt, from 0).
PART = re.compile(r"(pos|ttt) ?(\d+)")
PART_LISTS = {"pos": ("loss_pos", 1), "ttt": ("loss_ttt", 0)}  # the list, its first number
READ_S = 120.0  # a long run's metrics.jsonl over a slow link


def part_name(kind: str, index: int) -> str:
    """The name of item `index` of a step's loss_pos ("pos") or loss_ttt ("ttt")."""
    return f"{kind} {index + PART_LISTS[kind][1]}"


class SeriesError(Exception):
    """A run has no such curve: a metric or x axis it never logged."""


@dataclass(frozen=True)
class Series:
    name: str  # run id, or the tmux session of a run trackside did not launch
    host: str
    params: dict = field(default_factory=dict)
    parent: str | None = None
    events: tuple[dict, ...] = ()  # step records in order; a pane's have only step and loss
    start_time: float | None = None
    code: dict | None = None  # the code it ran, where trackside shipped or synced it (runs.code_of)
    # What its step numbers count: a trainer's steps, a boosting library's rounds, or, where
    # its console said no step, the losses printed in order (ConsoleSummary.axis).
    axis: str = "step"

    def curve(self, metric: str, x: str = "step") -> list[tuple[float, float]]:
        """(x, value) points of `metric` against `x` (the step, tokens seen so far, or
        seconds since the run started); SeriesError naming what the run never logged."""
        if x not in X_AXES:
            raise SeriesError(f"x axis {x!r}: choose one of {', '.join(X_AXES)}")
        xs = self._xs(x)
        points = [(at, v) for at, e in zip(xs, self.events) if at is not None and (v := value(e, metric)) is not None]
        if not points:
            logged = [k for k in metrics_of(self.events) if k != "step"]
            said = f"it logged {', '.join(logged)}" if logged else "it logged no steps"
            what = f"{metric} against {x}" if any(value(e, metric) is not None for e in self.events) else metric
            raise SeriesError(f"{self.name} on {self.host} never logged {what} ({said})")
        return points

    def _xs(self, x: str) -> list[float | None]:
        if x == "step":
            return [number(e.get("step")) for e in self.events]
        if x == "time":
            times = [number(e.get("time")) for e in self.events]
            start = self.start_time if self.start_time is not None else next((t for t in times if t is not None), None)
            return [None if t is None or start is None else t - start for t in times]
        seen, xs = 0.0, []
        for e in self.events:
            tokens = number(e.get("tokens"))
            seen += tokens or 0.0
            xs.append(seen if tokens is not None else None)
        return xs


class Overlay(NamedTuple):
    """Another run drawn behind a run: its legend (how the two differ) and its series."""

    label: str
    series: Series


def number(value) -> float | None:
    """A value fit to plot; metrics lines are the trainer's, or anyone's garbage."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        value = float(value)
    except OverflowError:  # an int past any float
        return None
    return value if math.isfinite(value) else None


def value(event: dict, metric: str) -> float | None:
    """A step record's `metric`: a number it carries, the first item of an alias's list, or
    one part of its loss (`pos 8`, `ttt 2`)."""
    if part := PART.fullmatch(metric):
        name, first = PART_LISTS[part.group(1)]
        items, at = event.get(name), int(part.group(2)) - first
        return number(items[at]) if isinstance(items, (list, tuple)) and 0 <= at < len(items) else None
    for name in ALIASES.get(metric, ()):
        items = event.get(name)
        if isinstance(items, (list, tuple)) and items:
            return number(items[0])
    return number(event.get(metric))


def metrics_of(events) -> list[str]:
    """The metrics the records carry, in the order they first appear."""
    names: dict[str, None] = {}
    for e in events:
        for k, v in e.items():
            if number(v) is not None and k not in ("event", "time", "epoch"):
                names[k] = None
        if any(isinstance(e.get(n), (list, tuple)) for n in ALIASES["acc"]):
            names["acc"] = None
    return list(names)


def from_metrics(name: str, host: str, text: str, *, params: dict | None = None, parent: str | None = None) -> Series:
    """A series from metrics.jsonl's text. A resumed run (a start event saying from which
    step) redoes the steps after its checkpoint: the ones logged before are dropped."""
    events: list[dict] = []
    start_time = None
    for line in text.splitlines():
        event = parse_metrics_line(line)
        if event is None:
            continue
        if event["event"] == START:
            start_time = number(event.get("time")) if start_time is None else start_time
            config = event.get("config")
            resumed = number(config.get("resumed_from_step")) if isinstance(config, dict) else None
            if resumed is not None:
                events = [e for e in events if (number(e.get("step")) or 0) <= resumed]
        elif event["event"] == STEP:
            events.append(event)
    return Series(name, host, dict(params or {}), parent, tuple(events), start_time)


def console_events(said: console.ConsoleSummary) -> tuple[dict, ...]:
    """A console's fold as step records: its training loss (`loss`) and its evaluations'
    (`eval_loss`), a series each, in step order."""
    points = [(s, 0, {"step": s, "loss": v}) for s, v in said.curve] + [(s, 1, {"step": s, "eval_loss": v}) for s, v in said.eval_curve]
    return tuple(event for *_, event in sorted(points, key=lambda p: p[:2]))


def from_console(name: str, host: str, text: str, *, params: dict | None = None, parent: str | None = None) -> Series:
    """A series from what a program printed (its console.log: the pane's bytes)."""
    said = console.ConsoleSummary()
    said.add_recorded(text)
    said.settle()
    return Series(name, host, dict(params or {}), parent, console_events(said), axis=said.axis)


async def of_run(host: Host, run_id: str) -> Series:
    """A run trackside launched; RunError when the host has no such run."""
    manifest = await runs.read_manifest(host, run_id)
    directory = manifest.get("run_dir") or await runs.run_dir(host, run_id)
    known = {"params": manifest.get("params") or {}, "parent": manifest.get("parent")}
    series = from_metrics(run_id, host.name, await runs.read_file(host, f"{directory}/metrics.jsonl", READ_S) or "", **known)
    if not series.events:
        series = from_console(run_id, host.name, await runs.read_file(host, f"{directory}/console.log", READ_S) or "", **known)
    return replace(series, code=runs.code_of(manifest))


async def of_session(host: Host, session: str) -> Series:
    """A tmux session trackside did not launch, from its panes' recorded output; RunError
    when the host has no such session."""
    read = await panes.read_session(host, session)
    if read is None:
        raise runs.RunError(f"no run or tmux session {session!r} on {host.name}")
    return Series(session, host.name, events=console_events(read.summary), axis=read.summary.axis)


async def of_target(host: Host, target: str, listed: list[runs.RunInfo]) -> Series:
    """A run id, or a session name: the newest run of that name in the host's listing
    (session names are reused once free), else the foreign session itself."""
    if runs.RUN_ID.fullmatch(target):
        return await of_run(host, target)
    named = [r for r in listed if r.session == target]
    if named and named[0].run_id:
        return await of_run(host, named[0].run_id)
    return await of_session(host, target)


async def ancestors(host: Host, parent: str | None, depth: int = ANCESTORS) -> list[Series]:
    """Run `parent` and the runs it was relaunched from, nearest first; a parent whose run
    dir is gone ends the line."""
    line: list[Series] = []
    while parent and len(line) < depth:
        try:
            ancestor = await of_run(host, parent)
        except runs.RunError:
            break
        line.append(ancestor)
        parent = ancestor.parent
    return line


def changed(before: dict, after: dict, before_code: dict | None = None, after_code: dict | None = None) -> str:
    """How `after`'s params differ from `before`'s, as `ttt_steps 3 → 5, lr 3e-4 → 1e-4`,
    and its code from `before`'s where it does (runs.code_of): `code 1a2b3c4 → 5d6e7f8`."""
    keys = [k for k in {**before, **after} if before.get(k) != after.get(k)]
    said = [f"{k} {_shown(before.get(k))} → {_shown(after.get(k))}" for k in keys]
    if runs.code_differs(before_code, after_code):
        said.append(f"code {_code(before_code)} → {_code(after_code)}")
    return ", ".join(said) or "same params"


def _shown(value) -> str:
    return "unset" if value is None else str(value)


def _code(code: dict | None) -> str:
    """A run's code in a legend: its package's short hash (else its first synced
    directory's); the host's own trainer where trackside recorded none."""
    if code is None:
        return "host's"
    digest = code["hash"] or next((s["hash"] for s in code["synced"]), None) or "?"
    return digest[:7]
