"""Listing runs: every run directory on a host with how its run stands, then every tmux
session trackside did not launch, known by what its pane prints."""

from __future__ import annotations

import enum
import posixpath
from collections.abc import Awaitable, Callable, Collection
from dataclasses import asdict, dataclass, field, fields

from backends import pace, procs, tmux
from backends.hosts import Host, HostError
from backends.logs.console import ConsoleSummary
from backends.logs.logparse import Progress, parse_metrics_line
from backends.logs.panes import Recordings, panes_on_gpu, run_pane
from backends.logs.record import MetricsRecord
from backends.own_session import own_sessions
from backends.runs.manifest import MAX_BYTES, ManifestError, parse_manifest
from backends.runs.rundir import manifest_exit_status, parse_exit_status, record_end, runs_root
from backends.runs.stops import mark_interrupted
from training.contract import CLEAN_ENDS, EXIT_OOM

METRICS_TAIL_LINES = 64
METRICS_READ_BYTES = 1 << 20  # of each end of metrics.jsonl: its lines are a few hundred bytes

# For each run dir under "$1" (a dir named as a run id, so its name holds no separator): a
# record-separator line with the dir, the manifest (its first "$3" bytes), a file-separator
# with the recorded exit status, a unit-separator with whether the trainer of a run typed by
# hand (training/register.py) is alive, a group-separator line, then the first and last
# "$2" lines of metrics.jsonl (within "$4" bytes of either end), and before those a live
# run's pace window of "$5" seconds (_PACE_LINES). The files may be anyone's:
# the separators in them become '?', so no file can end its record or forge another (JSON
# holds none of them raw, so no valid file changes).
_RUN_DIR_GLOB = "[0123456789]" * 8 + "-" + "[0123456789]" * 4 + "-" + "[0123456789abcdef]" * 4
_READ_RUNS = r"""
clean() { tr '\034\035\036\037' '????'; }
for d in "$1"/RUN_DIR/; do
  [ -f "${d}manifest.json" ] || continue
  printf '\036%s\n' "$d"
  head -c "$3" "${d}manifest.json" | clean; echo
  printf '\034'; head -c 32 "${d}exit_status" 2>/dev/null | clean; echo
  printf '\037'
  if [ -f "${d}trainer.pid" ]; then
    read p < "${d}trainer.pid"
    case $p in ''|*[!0-9]*) echo gone ;; *) kill -0 "$p" 2>/dev/null || [ -d "/proc/$p" ] && echo alive || echo gone ;; esac
  fi
  printf '\035\n'
  if [ -f "${d}metrics.jsonl" ]; then
    head -c "$4" "${d}metrics.jsonl" | head -n 1 | clean; echo
    w=$5; [ -f "${d}exit_status" ] && w=-1  # an ended run has no pace to measure
    tail -c "$4" "${d}metrics.jsonl" | awk -v n="$2" -v w="$w" 'PACE_LINES' | clean
  fi
done
"""
# Of the tail read: its last "n" lines, and from the first step event at least "w" seconds
# older than the latest (a live run's pace window, backends/pace.py) on; which lines are
# step events and their times are read roughly here, exactly in Python from what is sent.
_PACE_LINES = r"""
{ line[NR] = $0 }
/^[{]"event": "step", "time": [0-9]/ { s = $0; sub(/^[{]"event": "step", "time": /, "", s); t[NR] = s + 0; last = NR }
END {
  from = NR - n + 1
  if (w >= 0 && last) {
    for (i = last; i > 1 && !(i in t && t[i] <= t[last] - w); i--) ;
    if (i < from) from = i
  }
  for (i = (from < 1 ? 1 : from); i <= NR; i++) print line[i]
}
"""
_READ_RUNS = _READ_RUNS.replace("RUN_DIR", _RUN_DIR_GLOB).replace("PACE_LINES", _PACE_LINES)


class RunPhase(enum.Enum):
    """Where a run is in its life, as a listing finds it (the dashboard's view of a whole
    run is tui.state.RunState)."""

    RUNNING = "running"
    EXITED = "exited"
    OOM = "oom"
    UNKNOWN = "unknown"
    UNREADABLE = "unreadable"  # a run dir whose manifest is no manifest: `unreadable` says why


@dataclass
class NodeInfo:
    """One host's part of a multi-node run (backends/nodes/): its torchrun agent and
    workers, in its own tmux session and run dir on that host."""

    host: str
    node: int  # the launch's order; node 0's host serves the rendezvous
    session: str | None = None
    run_dir: str | None = None
    state: str = RunPhase.UNKNOWN.value  # unknown until its host is listed
    exit_status: int | None = None
    pids: list[int] = field(default_factory=list)


@dataclass
class RunInfo:
    run_id: str | None  # None: a tmux session trackside did not launch
    session: str
    host: str
    state: RunPhase
    exit_status: int | None = None
    params: dict = field(default_factory=dict)
    last_step: int | None = None
    last_loss: float | None = None
    steps_per_epoch: int | None = None
    pids: list[int] = field(default_factory=list)
    run_dir: str | None = None
    parent: str | None = None
    started: str | None = None
    end_status: str | None = None  # the trainer's own end event: completed, stopped, ...
    this_dashboard: bool = False  # the session this trackside runs in: never to be stopped
    session_open: bool = True  # its tmux session still there to attach to (an ended run's may be gone)
    progress: Progress | None = None  # a foreign session's latest bar or N/M counter
    nodes: list[NodeInfo] = field(default_factory=list)  # a multi-node run's, in node order; else empty
    tokens_per_s: float | None = None  # over the pace window (backends/pace.py)
    tau: float | None = None  # a DFlash run's latest expected accepted length
    eta_s: float | None = None  # to the last step at the rate over the pace window (backends/pace.py)
    # A session trackside did not launch: what its run pane printed (backends.logs.panes), the
    # pane (`window.pane`), and since when its curve holds every step printed (epoch s;
    # None: only what its screen showed).
    console: ConsoleSummary | None = None
    eval_loss: float | None = None  # its latest evaluation's, apart from the training loss
    pane: str | None = None
    recorded_since: float | None = None
    # What a run launched with shipped or synced code runs (code_of), and whether that
    # differs from what its parent ran (None: either ran code trackside did not record).
    code: dict | None = None
    code_changed: bool | None = None
    unreadable: str | None = None  # why its run dir's manifest cannot be read (state UNREADABLE)
    # A kill of it that did not finish, while some of its processes live (backends/runs/stops.py).
    stop: dict | None = None
    # The pane its manifest names, alive or not: with its session, who it is in the host's
    # GPU recording after it ended too (backends/recorder/energy.py).
    pane_pid: int | None = None

    def to_json(self) -> dict:
        shown = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "console"}
        doc = asdict(RunInfo(**shown))
        del doc["console"]
        return {**doc, "state": self.state.value, "pace_window_s": pace.WINDOW_S}


def _metrics(lines: list[str]) -> MetricsRecord:
    record = MetricsRecord(keep=len(lines))  # the last lines and a live run's pace window
    for line in lines:
        # A line being written as we read, or garbage: not ours to judge.
        if (event := parse_metrics_line(line)) is not None:
            record.add(event)
    return record


def code_of(manifest: dict) -> dict | None:
    """The code a run runs, as its manifest records it (backends.ship.deliver): the shipped
    package's hash and `git describe`, each synced directory's; None if it recorded none."""
    code, synced = manifest.get("code"), manifest.get("synced") or []
    if not code and not synced:
        return None
    return {
        "hash": code.get("hash") if code else None, "describe": code.get("describe") if code else None,
        "synced": [{k: s.get(k) for k in ("to", "hash", "describe")} for s in synced],
    }  # fmt: skip


def code_differs(before: dict | None, after: dict | None) -> bool | None:
    """Whether two runs' code (code_of) differs: the package, or a directory both synced;
    the host's own trainer against recorded code does; None when neither recorded any."""
    if before is None or after is None:
        return None if before is after else True
    synced = {s["to"]: s["hash"] for s in before["synced"]}
    return before["hash"] != after["hash"] or any(synced.get(s["to"], s["hash"]) != s["hash"] for s in after["synced"])


def launcher_code(end_status: str | None, exit_status: int | None) -> bool:
    """Whether a nonzero exit code is the launcher's after the trainer's own clean end
    (torchrun exits 1 on a clean stop's SIGTERM though its workers saved and exited 0),
    not the run's failure."""
    return bool(exit_status) and end_status in CLEAN_ENDS


async def _read_run_dirs(host: Host) -> list[tuple[str, dict | str, int | None, MetricsRecord]]:
    """(run dir, its manifest or why it is unreadable, recorded exit status, metrics) for
    every run dir on the host; a run typed by hand has `trainer_alive` added to its manifest."""
    args = [await runs_root(host), str(METRICS_TAIL_LINES), str(MAX_BYTES + 1), str(METRICS_READ_BYTES), str(pace.WINDOW_S)]
    result = await host.run(["sh", "-c", _READ_RUNS, "sh", *args])
    if not result.ok:
        raise HostError(host.name, f"cannot read run dirs: {result.stderr.strip()}")
    runs = []
    for record in result.stdout.split("\036")[1:]:
        head, _, metrics = record.partition("\035\n")
        head, _, status = head.partition("\034")
        status, _, trainer = status.partition("\037")
        directory, _, manifest_text = head.partition("\n")
        directory = directory.rstrip("/")
        try:
            manifest: dict | str = parse_manifest(manifest_text, posixpath.basename(directory))
            if "run_id" not in manifest:
                raise ManifestError("run_id: missing")
        except ManifestError as e:
            manifest = str(e)
        else:
            if manifest.get("registered"):
                manifest["trainer_alive"] = trainer.strip() == "alive"
            manifest.setdefault("params", {})
        runs.append((directory, manifest, parse_exit_status(status), _metrics(metrics.splitlines())))
    return runs


def _state(exit_status: int | None, oom: bool, trainer: bool) -> RunPhase:
    # Exit code 3 means OOM only for our trainer; other programs use it freely.
    if oom or (trainer and exit_status == EXIT_OOM):
        return RunPhase.OOM
    return RunPhase.UNKNOWN if exit_status is None else RunPhase.EXITED


async def _processes(host: Host) -> dict[int, procs.Proc]:
    try:
        return await procs.process_table(host)
    except HostError:  # no /proc (not Linux): no pane is known to be back at its prompt
        return {}


async def manifests(host: Host) -> list[dict]:
    """Every readable run dir's manifest on the host, and nothing else: no tmux session
    listed, no pane recorded (`trackside replay` finding the runs relaunched from one)."""
    return [manifest for _, manifest, _, _ in await _read_run_dirs(host) if isinstance(manifest, dict)]


async def list_runs(
    host: Host, recordings: Recordings | None = None, gpu_pids: Callable[[], Awaitable[Collection[int]]] | None = None
) -> list[RunInfo]:
    """Our runs (newest first), then every tmux session we did not launch, read from its
    panes' recordings: `recordings`, a dashboard's, read on from its last listing; without
    it, every recording is read whole. `gpu_pids` gives the pids holding GPU memory on the
    host, asked only where a session has several live panes: the one running the trainer
    is the run's."""
    fresh = recordings is None  # a one-off reading: every recording read whole
    panes = await tmux.list_panes(host)
    dashboard = await own_sessions(host, panes)
    by_session: dict[str, list[tmux.Pane]] = {}
    for pane in panes:
        by_session.setdefault(pane.session, []).append(pane)
    claimed: set[str] = set()
    infos = []
    for directory, manifest, recorded, metrics in sorted(await _read_run_dirs(host), key=lambda r: r[0], reverse=True):
        if isinstance(manifest, str):  # one bad run dir is one row saying why, and hides nothing
            infos.append(RunInfo(posixpath.basename(directory), "", host.name, RunPhase.UNREADABLE, run_dir=directory,
                                 session_open=False, unreadable=manifest))  # fmt: skip
            continue
        session = manifest.get("session", "")
        own = [p for p in by_session.get(session, []) if p.pid == manifest.get("pane_pid")]
        if own:
            claimed.add(session)
        alive = [p.pid for p in own if not p.dead]
        if manifest.get("registered") and not manifest.get("trainer_alive"):
            alive = []  # typed at a shell, which outlives it: the trainer's own process says
        if manifest.get("ended") is not None:
            exit_status = manifest_exit_status(manifest)
        else:
            exit_status = recorded
            if exit_status is None and own and not alive:
                exit_status = own[0].exit_status  # sh itself was killed: tmux may know how
            if exit_status is not None:
                manifest = await record_end(host, manifest, exit_status)
        # A session that vanished without a recorded status stays UNKNOWN.
        ended = exit_status is not None or not alive
        state = _state(exit_status, metrics.oom is not None, bool(manifest.get("trainer"))) if ended else RunPhase.RUNNING
        nodes = [NodeInfo(n["host"], i, n.get("session"), n.get("run_dir")) for i, n in enumerate(manifest.get("nodes") or [])]
        for node in nodes:
            if node.node == manifest.get("node"):  # this host's own node: the others are their hosts' to say
                node.state, node.exit_status, node.pids = state.value, exit_status, [] if ended else alive
        infos.append(
            RunInfo(
                manifest["run_id"], session, host.name, state, exit_status, manifest.get("params", {}),
                metrics.step, metrics.value("loss"), metrics.steps_per_epoch,
                [] if ended else alive, manifest.get("run_dir"), manifest.get("parent"), manifest.get("started"),
                metrics.end_status, this_dashboard=session in dashboard, session_open=bool(own), nodes=nodes,
                tokens_per_s=None if ended else metrics.tokens_per_s(), tau=metrics.value("tau"),
                eta_s=None if ended else metrics.eta_s(manifest["params"]), code=code_of(manifest),
                pane_pid=manifest.get("pane_pid"),
            )  # fmt: skip
        )
    by_id = {info.run_id: info for info in infos}
    for info in infos:
        if (parent := by_id.get(info.parent)) is not None:
            info.code_changed = code_differs(parent.code, info.code)
    # A run of ours with no step events (a program other than the trainer, or the trainer
    # still loading) is known by its console.log, as the screen knows it.
    recordings = recordings or Recordings()
    quiet = {info.run_id: info for info in infos if info.last_step is None and info.run_dir and info.run_id}
    if quiet:
        logs = {key: f"{info.run_dir}/console.log" for key, info in quiet.items()}
        for key, said in (await recordings.read_logs(host, logs, drain=fresh)).items():
            info = quiet[key]
            info.console, info.last_step, info.last_loss = said, said.step, said.loss
            info.progress, info.eval_loss = said.progress, said.eval_loss
            if info.state is RunPhase.RUNNING:
                info.eta_s = said.eta_s
    foreign = [session for session in by_session if session not in claimed]
    # Foreign sessions are known by what their panes print; the dashboard's own pane
    # prints the dashboard, whose numbers are other runs'.
    reads = await recordings.read(host, [p for s in foreign if s not in dashboard for p in by_session[s]], drain=fresh)
    several = [p for s in foreign if s not in dashboard and sum(not q.dead for q in by_session[s]) > 1 for p in by_session[s]]
    on_gpu = await panes_on_gpu(host, several, await gpu_pids()) if several and gpu_pids is not None else set()
    table = await _processes(host) if any(not p.dead for s in foreign for p in by_session[s]) else {}
    for session in foreign:
        session_panes = by_session[session]
        alive = [p.pid for p in session_panes if not p.dead]
        status = None if alive else session_panes[0].exit_status
        read = run_pane([reads[p.pane_id] for p in session_panes if p.pane_id in reads], on_gpu)
        said = read.summary if read is not None else ConsoleSummary()
        # Its pane back at its shell's prompt, the readings kept: what printed them has returned.
        returned = read is not None and (said.step, said.loss) != (None, None) and procs.at_prompt(table, read.pane)
        state = RunPhase.EXITED if returned else RunPhase.RUNNING if alive else _state(status, False, False)
        infos.append(
            RunInfo(
                None, session, host.name, state, status,
                last_step=said.step, last_loss=said.loss, pids=alive, this_dashboard=session in dashboard,
                progress=said.progress, eta_s=said.eta_s if state is RunPhase.RUNNING else None, eval_loss=said.eval_loss,
                console=said if read is not None else None, pane=read.pane.where if read is not None else None,
                recorded_since=read.since if read is not None else None,
            )  # fmt: skip
        )
    await mark_interrupted(host, infos)
    return infos
