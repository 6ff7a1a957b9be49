"""A kill's journal: written on the host before the first signal goes out, closed once the
kill is done, so that a stop the dashboard or the CLI did not live to finish (SIGKILLed,
its SSH connection gone) is seen by the next listing: "stop interrupted: SIGTERM at 12:03,
3 processes still alive". Another kill of the same run finishes it and closes it.

A run of ours keeps its journal in its run dir (`kill.json`); a session trackside did not
launch, which has none, under the runs root (`kills/<hash of its name>.json`). Each write
is a new file made by mktemp (O_EXCL, mode 0600) renamed over the last, under a root and
directories checked as this user's alone (rundir.write_file): a planted link or another
user's file is refused, never written through. A journal that is not one, or lies in a
place its own kill would not have written it, is no interrupted stop.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Mapping

from backends import untrusted_json
from backends.hosts import Host, HostError
from backends.procs import process_table, same
from backends.runs.rundir import write_file
from training.contract import RUN_ID

JOURNAL = "kill.json"  # in a run dir
FOREIGN_DIR = "kills"  # under the runs root: sessions trackside did not launch
MAX_BYTES = 1 << 16
SIGNALS = ("TERM", "KILL")

# Every journal under the runs root "$1" that is this user's alone (a regular file, no
# other can write): a record-separator line with its path, then its first "$2" bytes (a
# separator in it becomes '?': no file can forge another's record).
_READ = r"""
root=$1 max=$2 me=$(id -u)
for f in "$root"/*/kill.json "$root"/kills/*.json; do
  [ -f "$f" ] && [ ! -L "$f" ] || continue
  set -- $(stat -c '%u %a' -- "$f")
  [ "$1" = "$me" ] && [ $((0$2 & 022)) -eq 0 ] || continue
  printf '\036%s\n' "$f"
  head -c "$max" -- "$f" | tr '\036' '?'
done
"""


def _path(root: str, run_id: str | None, session: str) -> str:
    """Where the journal of a run (its run dir) or of a session with no run dir is: the
    hash of its name, so that any name tmux allows is one file name."""
    if run_id:
        return f"{root}/{run_id}/{JOURNAL}"
    return f"{root}/{FOREIGN_DIR}/{hashlib.sha256(session.encode()).hexdigest()[:16]}.json"


class Journal:
    """One kill's journal on one host: opened with the processes it is to stop and the
    first signal it is about to send."""

    def __init__(self, host: Host, path: str, doc: dict):
        self.host, self.path, self.doc = host, path, doc
        self.error: str | None = None  # why a write failed: the kill goes on (a full disk must not keep a run alive)

    @classmethod
    async def open(cls, host: Host, *, target: str, session: str | None, run_id: str | None, tree: Mapping[int, int], signal: str) -> Journal:
        run_id = run_id if run_id and RUN_ID.fullmatch(run_id) else None  # a manifest's may be anyone's
        session = session or target
        path = _path(await host.expanded_runs_root(), run_id, session)
        doc = {"target": target, "session": session, "run_id": run_id, "opened": time.time(),
               "tree": {str(pid): started for pid, started in sorted(tree.items())}, "signals": [], "closed": None}  # fmt: skip
        journal = cls(host, path, doc)
        await journal.signal(signal)
        return journal

    async def signal(self, signal: str, tree: Mapping[int, int] | None = None) -> None:
        """Record `signal` as about to go out (before it does: a kill cut short after it
        still says so), and the processes the kill now knows."""
        if tree is not None:
            self.doc["tree"] = {str(pid): started for pid, started in sorted(tree.items())}
        self.doc["signals"].append({"signal": signal, "time": time.time()})
        await self._write()

    async def close(self) -> None:
        self.doc["closed"] = time.time()
        await self._write()

    async def _write(self) -> None:
        try:
            await write_file(self.host, self.path, json.dumps(self.doc) + "\n")
        except HostError as e:
            self.error = e.reason


def _open_stop(text: str) -> dict | None:
    """A journal's interrupted stop: its session, run id, last signal and when, and its
    processes; None for a closed journal or anything that is not a journal."""
    try:
        doc = untrusted_json.loads(text)
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("closed") is not None:
        return None
    signals, tree, session, run_id = doc.get("signals"), doc.get("tree"), doc.get("session"), doc.get("run_id")
    if not (isinstance(signals, list) and signals and isinstance(tree, dict) and isinstance(session, str)):
        return None
    last = signals[-1]
    if not isinstance(last, dict) or last.get("signal") not in SIGNALS:
        return None
    when = last.get("time")
    if isinstance(when, bool) or not isinstance(when, (int, float)) or not math.isfinite(when):
        return None
    try:
        processes = {int(pid): started for pid, started in tree.items() if type(started) is int}
    except ValueError:
        return None
    run_id = run_id if isinstance(run_id, str) and RUN_ID.fullmatch(run_id) else None
    return {"session": session, "run_id": run_id, "signal": last["signal"],
            "time": when, "tree": processes}  # fmt: skip


async def interrupted(host: Host) -> list[dict]:
    """Every stop on the host whose kill did not finish while some of its processes live:
    each with `session`, `run_id` (None for a session trackside did not launch), the last
    `signal` sent and its `time` (epoch s), and how many processes are `alive`: those of
    its `tree` (pid: start time) that are still themselves."""
    root = await host.expanded_runs_root()
    result = await host.run(["sh", "-c", _READ, "sh", root, str(MAX_BYTES)])
    stops = []
    for record in result.stdout.split("\036")[1:]:
        path, _, text = record.partition("\n")
        # Only where its own kill would have written it: no journal speaks for another run.
        if (stop := _open_stop(text)) and path == _path(root, stop["run_id"], stop["session"]):
            stops.append(stop)
    if not stops:
        return []
    table = await process_table(host)
    found = []
    for stop in stops:
        if tree := same(table, stop["tree"]):
            found.append({**stop, "tree": tree, "alive": len(tree)})
    return found


def stop_of(stops: list[dict], run_id: str | None, session: str) -> dict | None:
    """The interrupted stop of a run (by its id) or of a session trackside did not launch
    (by its name)."""
    return next((s for s in stops if (s["run_id"] == run_id if run_id else s["run_id"] is None and s["session"] == session)), None)


async def mark_interrupted(host: Host, infos: list) -> None:
    """Give each listed run (a listing's RunInfo) its interrupted stop, `stop`, if it has
    one; a host whose processes cannot be read shows none rather than no runs."""
    try:
        found = await interrupted(host)
    except HostError:
        return
    for info in infos:
        if (stop := stop_of(found, info.run_id, info.session)) is not None:
            info.stop = {k: stop[k] for k in ("signal", "time", "alive")}
