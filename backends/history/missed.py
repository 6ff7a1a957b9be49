"""The alerts that would have fired while nobody watched (`trackside watch --since`): the
watcher's rules replayed over the span (backends/history/alert_times.py), so each alert
reads as it would have and carries the moment it would have been raised.

The facts come from what outlived the span: the GPUs from the host's recording (read.py;
none where it has a gap, so no under-fed stretch spans one), a run of trackside's from its
run dir (its end when its exit status was written, its steps, skips and OOM in
metrics.jsonl), a session it did not launch from its listing now and its pane's recording
(it ended when its log last grew, as the recorder's size index saw it).
"""

from __future__ import annotations

from backends import alerts, runs, runsroot, tmux
from backends.history.alert_times import RunPast, Said, host_alert_times, run_alert_times, timed
from backends.history.read import parse_events
from backends.hosts import Host
from backends.logs import recording
from backends.recorder import layout
from backends.recorder.read import Recording, read_recording
from backends.runs import RunInfo, RunPhase
from backends.runs.rundir import epoch, read_file

# When the run's command ended: its exit_status file's last change (the launcher's shell
# writes it as the command ends; the manifest's `ended` is when a listing first saw it).
_EXITED_AT = 'above_ok "$1"; files_ok "$1/exit_status"; stat -c %Y -- "$1/exit_status" 2>/dev/null'


async def _trackside_run(host: Host, info: RunInfo, key: str, answered_at: float | None) -> RunPast:
    ended = None
    if info.state is not RunPhase.RUNNING:
        result = await runsroot.run(host, _EXITED_AT, [info.run_dir])
        ended = float(result.stdout) if result.ok and result.stdout.strip().isdigit() else None
    events = []
    try:
        events, _ = parse_events(await read_file(host, f"{info.run_dir}/metrics.jsonl") or "")
    except runs.RunError:
        pass
    events = timed(events)
    if info.state is not RunPhase.RUNNING and ended is None:
        ended = events[-1]["time"] if events else None  # its last word, where no status was written
    return RunPast(key, info, events, ended, answered_at)


def _foreign_run(info: RunInfo, key: str, panes: list[tmux.Pane], root: str, socket: str | None, rec: Recording) -> RunPast:
    """A session trackside did not launch: ended when its pane's log last grew."""
    logs = {recording.recording_of(root, socket, p).log.removeprefix(f"{root}/") for p in panes if p.session == info.session}
    # The index says each log's size again at each new day file and restart: the end is
    # where a size last differed from the one before it in the span, not its last mention
    # (one that never grew in the span ended before it, or is not known to have ended).
    grew, size = [], {}
    for entry in sorted((e for e in rec.logs if e.path in logs), key=lambda e: e.time):
        if entry.path in size and size[entry.path] != entry.size:
            grew.append(entry.time)
        size[entry.path] = entry.size
    ended = None if info.state is RunPhase.RUNNING else max(grew, default=None)
    return RunPast(key, info, [], ended)


async def missed(host: Host, since: float, now: float, rules: alerts.Rules = alerts.Rules()) -> tuple[list[Said], bool]:
    """Each alert that would have been raised or cleared on `host` from `since` to `now`,
    from its recording, its run dirs and its listing now; and whether its recording held any
    GPU sample then (without one, no under-fed GPU could be found)."""
    # The recorder keeps CAP_BYTES at most in all: a reading allowed as many is never cut.
    rec = await read_recording(host, since, now, max_bytes=layout.CAP_BYTES)
    root = await host.expanded_runs_root()
    infos = await runs.list_runs(host)
    panes = await tmux.list_panes(host)
    relaunched: dict[str, float] = {}  # a run's id: when its first relaunch started
    for child in infos:
        if child.parent and (started := epoch(child.started)) is not None:
            relaunched[child.parent] = min(started, relaunched.get(child.parent, started))
    said = host_alert_times(host.name, rec, since, now, rules)
    for info in infos:
        key = f"{host.name}/{info.run_id or info.session}"
        if info.run_id and info.run_dir:
            past = await _trackside_run(host, info, key, relaunched.get(info.run_id))
        elif info.run_id is None:
            past = _foreign_run(info, key, panes, root, host.tmux_socket, rec)
        else:
            continue
        said += run_alert_times(past, now, rules, since)
    return sorted(said, key=lambda s: s[0]), bool(rec.gpus)
