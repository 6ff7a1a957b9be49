"""A run's past read from its host, once: a run of trackside's from its run dir (manifest,
metrics.jsonl, console.log, kill journal, exit status, the runs relaunched from it), a
tmux session trackside did not launch from its panes' recordings under the runs root
(`panes/`, backends/logs/recording.py: as the fleet reads it, though the session is gone),
and the host's GPU recording over the run's life (backends/recorder).

Every file is read through the runs root's checks (backends/runsroot.py): another user's
file, or a link, is refused, never read through.
"""

from __future__ import annotations

import re
import time

from backends import runs, runsroot, tmux, untrusted_json
from backends.history.frame import History
from backends.history.tape import Tape
from backends.hosts import Host, HostError
from backends.logs import recording
from backends.logs.console import ConsoleSummary
from backends.logs.logparse import parse_metrics_line
from backends.recorder.read import read_recording
from backends.runs.listing import manifests
from backends.runs.rundir import epoch
from backends.runs.stops import JOURNAL, SIGNALS
from training.contract import END, STEP

MAX_LOG_BYTES = 1 << 26  # of one log file: the first this many bytes are replayed
READ_S = 120.0  # a long run's metrics over a slow link
MARGIN_S = 120.0  # GPU samples read from this long before the run's start (its first reading)

# Each recorded session directory `<socket>/<name>-<created>/` under "$1"/panes whose
# name is "$2": its path, then a tab and the name of each pane log in it.
_SESSIONS = r"""root_ok "$1"
for d in "$1"/panes/*/"$2"-*/; do
  [ -d "$d" ] && [ ! -L "${d%/}" ] || continue
  printf '%s\n' "${d%/}"
  for f in "$d"*.log; do [ -f "$f" ] && printf '\t%s\n' "${f##*/}"; done
done
"""
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")  # as recording.recording_of names a session's directory
_PANE_LOG = re.compile(r"([0-9]{1,9})\.log")


async def read_history(host: Host, target: str) -> History:
    """`target`: a run id, or a tmux session trackside did not launch (its newest
    recording); RunError where the host has neither."""
    history = await (_run(host, target) if runs.RUN_ID.fullmatch(target) else _session(host, target))
    history.record(await read_recording(host, history.start - MARGIN_S))
    with_sizes(history)
    return history


def parse_events(text: str) -> tuple[list[dict], int]:
    """metrics.jsonl's events, and how many lines were none; a step event whose step is no
    whole number or whose time is no number is none (the rules compare them)."""
    events, garbled = [], 0
    for line in text.splitlines():
        event = parse_metrics_line(line)
        t = event.get("time") if event else None
        good = event is not None and isinstance(t, (int, float)) and not isinstance(t, bool)
        if good and event["event"] == STEP:
            step = event.get("step")
            good = isinstance(step, int) and not isinstance(step, bool)
        if good:
            events.append(event)
        elif line.strip():
            garbled += 1
    return events, garbled


def parse_stops(text: str | None) -> list[dict]:
    """A kill journal's signals, each {signal, time}; none from a file that is no journal."""
    try:
        doc = untrusted_json.loads(text or "")
    except ValueError:
        return []
    signals = doc.get("signals") if isinstance(doc, dict) else None
    return [{"signal": s["signal"], "time": float(s["time"])} for s in signals or ()
            if isinstance(s, dict) and s.get("signal") in SIGNALS and isinstance(s.get("time"), (int, float))
            and not isinstance(s.get("time"), bool)] if isinstance(signals, list) else []  # fmt: skip


async def _bytes(host: Host, paths: dict[str, str]) -> dict[str, bytes]:
    """Each file's first MAX_LOG_BYTES (a missing one: absent)."""
    got = await recording.read(host, [(key, path, 0, "-") for key, path in paths.items()], max_bytes=MAX_LOG_BYTES)
    return {r.key: r.data for r in got if r.size >= 0}


async def _run(host: Host, run_id: str) -> History:
    manifest = await runs.read_manifest(host, run_id)
    directory = await runs.run_dir(host, run_id)
    events, garbled = parse_events(await runs.read_file(host, f"{directory}/metrics.jsonl", READ_S) or "")
    log = (await _bytes(host, {"log": f"{directory}/console.log"})).get("log")
    exit_status = await runs.read_exit_status(host, directory)
    if exit_status is None:
        exit_status = runs.manifest_exit_status(manifest)
    try:
        stops = parse_stops(await runs.read_file(host, f"{directory}/{JOURNAL}"))
    except runs.RunError:
        stops = []
    # From the manifests alone: a listing would record every pane it meets, and replay only reads.
    relaunched = [(m.get("run_id"), epoch(m.get("started"))) for m in await manifests(host)
                  if m.get("parent") == run_id and isinstance(m.get("run_id"), str)]  # fmt: skip
    times = [e["time"] for e in events]
    start = epoch(manifest.get("started")) or (min(times) if times else time.time())
    ended = exit_status is not None or manifest.get("ended") is not None or any(e["event"] == END for e in events)
    tape = Tape(f"{run_id}/console.log", current=log) if log is not None else None
    history = History(run_id, host.name, run_id, manifest.get("session") or run_id, start, start, ended, events, garbled,
                      params=manifest.get("params") or {}, parent=manifest.get("parent"), exit_status=exit_status,
                      tape=tape, stops=stops, relaunches=[(r, t) for r, t in relaunched if t is not None])  # fmt: skip
    history.end = max([start, *times, *(s["time"] for s in stops)]) if ended else time.time()
    return history


async def _session(host: Host, session: str) -> History:
    """A session's newest recording (its name is reused once free), and in it the pane
    that holds its run: the one whose log gave steps or a loss, else the longest."""
    root = await host.expanded_runs_root()
    safe = _SAFE.sub("_", session)
    result = await runsroot.run(host, _SESSIONS, [root, safe])
    if not result.ok:
        raise HostError(host.name, f"cannot list the pane recordings: {result.stderr.strip()}")
    found: dict[str, list[str]] = {}
    current = None
    for line in result.stdout.splitlines():
        if line.startswith("\t"):
            if current is not None and (m := _PANE_LOG.fullmatch(line[1:])):
                found[current].append(m[1])
        else:
            name = line.rsplit("/", 1)[-1]
            created = re.fullmatch(re.escape(safe) + r"-([0-9]{1,12})", name)
            current = line if created and line.startswith(f"{root}/{recording.PANES_DIR}/") else None
            if current is not None:
                found[current] = []
    dirs = sorted((d for d in found if found[d]), key=lambda d: int(d.rsplit("-", 1)[1]))
    if not dirs:
        raise runs.RunError(f"no run or recorded tmux session {session!r} on {host.name} (runs root {root})")
    directory = dirs[-1]
    paths = {}
    for n in found[directory]:
        base = f"{directory}/{n}"
        paths |= {f"{n}.scrollback": f"{base}.scrollback", f"{n}.log.1": f"{base}.log.1", f"{n}.log": f"{base}.log"}
    files = await _bytes(host, paths)
    relative = directory.removeprefix(f"{root}/")
    tapes = [Tape(f"{relative}/{n}.log", current=files.get(f"{n}.log", b""), older=files.get(f"{n}.log.1", b""),
                  before=files.get(f"{n}.scrollback", b"")) for n in found[directory]]  # fmt: skip
    tape = max(tapes, key=_rank)
    created = int(directory.rsplit("-", 1)[1])  # the session's: with its name, one session ever
    live = any(p.created == created for p in await tmux.list_panes(host, session)) if tmux.is_session_name(session) else False
    return History(session, host.name, None, session, float(created), time.time() if live else float(created), not live, tape=tape)


def _rank(tape: Tape) -> tuple:
    said = ConsoleSummary()
    said.add_recorded(tape.data[-MAX_LOG_BYTES:].decode(errors="replace"))
    return said.step is not None or said.loss is not None, said.progress is not None, len(tape.data)


def with_sizes(history: History) -> None:
    """Give the history's tape the recording's sizes of its log, and date a session's
    life by them: from its recording's first size to its last change."""
    tape, rec = history.tape, history.recording
    if tape is None or rec is None:
        return
    sizes = [(s.time, s.size) for s in rec.logs if s.path == tape.path]
    history.tape = tape = Tape(tape.path, current=tape.current, older=tape.older, before=tape.before, sizes=sizes)
    if tape.times:
        changed = [t for t, before, after in zip(tape.times[1:], tape.offsets, tape.offsets[1:]) if after != before]
        history.end = max([history.end, tape.times[0], *changed])
