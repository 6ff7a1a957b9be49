"""The dashboard's alerts without a UI (`trackside watch`, tui/commands/watch.py: in its
own tmux session, in cron).

Each poll lists every host's runs, reads its GPUs and the metrics tail of each run it
watches, and applies backends.alerts' rules: each alert raised or cleared is one line on
stdout, and a raised one is handed to the `[alerts] command`.

It is also where a multi-node run that lost a node has its other nodes stopped
(backends.nodes.stop_orphans), named in a `node:` alert: the watcher is the supervisor
that runs unattended and already acts on what it sees, while a listing (`trackside runs`,
the dashboard's poll) must stay a read that never stops anything.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from backends import alerts, gpu, kill, nodes, runs
from backends.hosts import Host, HostError
from backends.logs import logparse
from training.contract import EXIT_FAILURE, EXIT_OK, NONFINITE, OOM, STEP

POLL_TIMEOUT_S = 20.0
INTERVAL_S = 5.0  # between polls

# The last lines of metrics.jsonl in each run dir given, each run after a record separator.
_TAILS = 'n=$1; shift; for d; do printf "\\036%s\\n" "$d"; tail -n "$n" "$d/metrics.jsonl" 2>/dev/null; done'


@dataclass
class Watched:
    host: Host
    smi: str = gpu.DEFAULT_SMI
    underfed: dict[int, float] = field(default_factory=dict)  # GPU index: under-fed since
    runs: list[alerts.RunFacts] = field(default_factory=list)  # as last listed


def _lost(error: BaseException) -> str:
    if isinstance(error, TimeoutError):
        return f"no answer within {POLL_TIMEOUT_S:.0f}s"
    if isinstance(error, HostError):
        return str(error)
    return f"{type(error).__name__}: {error}"


async def _tails(host: Host, run_dirs: list[str]) -> dict[str, list[dict]]:
    """Each run dir's latest metrics events."""
    if not run_dirs:
        return {}
    result = await host.run(["sh", "-c", _TAILS, "sh", str(alerts.LOSS_WINDOW + 1), *run_dirs])
    tails = {}
    for record in result.stdout.split("\036")[1:]:
        directory, _, text = record.partition("\n")
        events = (logparse.parse_metrics_line(line) for line in text.splitlines())
        tails[directory] = [e for e in events if e is not None]
    return tails


async def poll(watched: Watched, book: alerts.AlertBook, clock: Callable[[], float]) -> alerts.HostFacts:
    """The host's facts now; its runs' facts are left in `watched.runs`. A host that does
    not answer keeps its runs as last seen, so their alerts neither clear nor repeat."""
    host = watched.host
    try:
        async with asyncio.timeout(POLL_TIMEOUT_S):
            infos = await runs.list_runs(host)
            facts = [alerts.RunFacts(f"{host.name}/{i.run_id or i.session}", i) for i in infos]
            read = [f for f in facts if f.info.run_dir and book.watches(f)]
            tails = await _tails(host, [f.info.run_dir for f in read])
            snapshot = await gpu.read_gpus(host, watched.smi)
    except Exception as error:  # a host's trouble is an alert, never the watcher's end
        return alerts.HostFacts(host.name, lost=_lost(error))
    for fact in read:
        events = tails.get(fact.info.run_dir, [])
        fact.steps = [e for e in events if e["event"] == STEP]
        fact.oom = next((e for e in reversed(events) if e["event"] == OOM), None)
        fact.nonfinite = next((e for e in reversed(events) if e["event"] == NONFINITE), None)
    watched.runs = facts
    now = clock()
    readings = [(r, alerts.underfed_since(r, watched.underfed.get(r.index), now)) for r in snapshot.gpus]
    watched.underfed = {r.index: since for r, since in readings if since is not None}
    return alerts.HostFacts(host.name, gpus=readings)


async def _lost_nodes(hosts: list[Watched], book: alerts.AlertBook, grace_s: float) -> list[alerts.Alert]:
    """Stop the live nodes of each multi-node run that lost one; the `node:` alerts."""
    merged = nodes.merge([run.info for w in hosts for run in w.runs])
    by_name = {w.host.name: w.host for w in hosts}
    smis = {w.host.name: w.smi for w in hosts}
    stopped = await nodes.stop_orphans(merged, by_name, grace_s=grace_s, smis=smis)
    for run_id, report in stopped.items():  # how the stopped nodes end is no news
        for part in (report, *report.nodes):
            book.stopped(f"{part.host}/{run_id}")
    found = []
    for info in merged:
        alert = nodes.node_alert(info, stopped.get(info.run_id)) if info.nodes else None
        if alert and book.watches(alerts.RunFacts(f"nodes/{info.run_id}", info)):
            if alert.key in book.active:  # its words stay those it was raised with
                alert = book.active[alert.key].alert
            else:  # new: worth reading how its worker ended
                alert = nodes.node_alert(info, stopped.get(info.run_id), await nodes.root_causes(info, by_name))
            found.append(alert)
    return found


def alert_line(when: float, word: str, alert: alerts.Alert) -> str:
    return f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(when))}  {word:7}  {alert.text}"


async def watch(
    hosts: list[Watched],
    book: alerts.AlertBook,
    *,
    say: Callable[[str], None],
    command: list[str] | None = None,
    timeout_s: float = alerts.COMMAND_TIMEOUT_S,
    interval_s: float = INTERVAL_S,
    grace_s: float = kill.GRACE_S,
    once: bool = False,
    clock: Callable[[], float] = time.time,
) -> int:
    """Poll until cancelled (or once); `say` each alert raised and cleared, a line each
    (the command prints them). With `once`, 1 if any alert is up, else 0. A multi-node
    run's live nodes are stopped (SIGTERM, SIGKILL after `grace_s`) once one has died."""
    sent: set[asyncio.Task] = set()

    async def send(alert: alerts.Alert, raised: float) -> None:
        if problem := await alerts.run_command(command, alert, raised, timeout_s):
            say(problem)

    while True:
        facts = await asyncio.gather(*(poll(w, book, clock) for w in hosts))
        extra = await _lost_nodes(hosts, book, grace_s)
        now = clock()
        before = dict(book.active)
        raised = book.evaluate(facts, [run for w in hosts for run in w.runs], now, extra)
        for key, entry in before.items():
            if key not in book.active:
                say(alert_line(now, "cleared", entry.alert))
        for alert in raised:
            say(alert_line(now, alert.severity, alert))
            if command:
                task = asyncio.create_task(send(alert, now))
                sent.add(task)
                task.add_done_callback(sent.discard)
        if once:
            await asyncio.gather(*sent)
            return EXIT_FAILURE if book.active else EXIT_OK
        await asyncio.sleep(interval_s)
