"""What the dashboard knows, and how each report of the monitors changes it: the reducer,
with no Textual in it.

The app (tui/app.py) hands each message's fields to a transition here, then repaints and
speaks from what the transition returns; screens read `hosts`, `runs` and `alerts`, the
operator's actions (tui/run_actions.py) `pending`. Every change is a transition, named
for what happened (tests/tui/test_store_writes.py holds every other module to reading).
Plain data in, plain data out: a transition is read, and tested, without an app.
"""

from __future__ import annotations

from collections.abc import Iterable

from backends import nodes, runs
from backends.alerts import Alert, AlertBook, HostFacts, RunFacts, kill_alert, underfed_since
from backends.kill import KillReport
from backends.gpu import GpuSnapshot
from backends.logs import screen
from tui.state import GpuTrace, HostState, HostStatus, RunState, run_key

GONE_KEEP_S = 60.0  # a run gone from its host's listing stays this long, seen to go, then leaves the fleet


class Store:
    def __init__(self, host_names: Iterable[str], alert_book: AlertBook) -> None:
        self.hosts: dict[str, HostState] = {name: HostState(name) for name in host_names}
        self.runs: dict[str, RunState] = {}
        self.listings: dict[str, list[runs.RunInfo]] = {}  # each host's latest, merged into runs
        self.selected: set[str] = set()  # runs open on a run screen: followed even when exited
        self.pending: dict[str, dict] = {}  # edited params per run, applied by relaunch
        self.alert_book = alert_book
        self.alerts: dict[str, Alert] = {}  # up now, in the alert bar's order
        self.kill_alerts: dict[str, Alert] = {}
        self.stopped_runs: set[str] = set()  # stopped from here: a node the kill took is no lost node

    # --- transitions ----------------------------------------------------------------

    def gpus_polled(self, name: str, snapshot: GpuSnapshot, time: float) -> bool:
        """A host's GPUs read; True where the host was lost and is back."""
        host = self.hosts[name]
        host.gpus = snapshot
        # GPUs read means the host answered. A GPU error may be the host's own loss (the
        # stream reports it as state): whether the host is up is the listings' to say,
        # or a lost host would flap between offline and ok.
        back = snapshot.ok and self._answered(host, time)
        for reading in snapshot.gpus:
            trace = host.traces.setdefault(reading.index, GpuTrace())
            trace.power_w.append(reading.power_w or 0.0)
            trace.mem_mib.append(reading.mem_used_mib or 0)
            trace.underfed_since = underfed_since(reading, trace.underfed_since, time)
        return back

    def energy_metered(self, name: str, charges: dict, why: tuple[str, str] | None) -> None:
        """A host's recording read: each of its runs' charge (run key → Charge), or why
        none of them has one."""
        for key, run in self.runs.items():
            if name in run.hosts:
                run.energy[name] = why or charges.get(key) or ("none", f"no pane of it in the recording on {name}")

    def host_failed(self, name: str, status: str, message: str) -> None:
        host = self.hosts[name]
        host.status, host.message = HostStatus(status), message

    def runs_listed(self, name: str, listing: list[runs.RunInfo], time: float) -> bool:
        """A host's runs listed; True where the host was lost and is back."""
        back = self._answered(self.hosts[name], time)
        # A multi-node run is listed by each of its hosts, each knowing its own node: the
        # fleet's latest listings are merged into one entry per run (a host that cannot
        # be listed keeps its last listing, as its runs stay shown).
        self.listings[name] = listing
        listed = {}
        for info in nodes.merge([info for infos in self.listings.values() for info in infos]):
            home = self.home_of(info)
            listed[run_key(home, info)] = home, info
        for key, (home, info) in listed.items():
            run = self.runs.get(key)
            if run is None:
                self.runs[key] = run = RunState(key, info.host, info, home=home)
            run.info, run.host, run.gone, run.gone_since = info, info.host, False, None
        for key, run in list(self.runs.items()):
            if key not in listed and name in run.hosts:
                run.gone = True
                run.gone_since = run.gone_since or time
                if time - run.gone_since > GONE_KEEP_S and key not in self.selected:
                    del self.runs[key]
                    self.pending.pop(key, None)
        return back

    def metrics_batch(self, key: str, events: list[dict], garbled: int) -> bool:
        """A run's new metrics events; False where the run is not (or no longer) known."""
        run = self.runs.get(key)
        if run is None:
            return False
        for event in events:
            run.add_event(event)
        run.garbled += garbled
        return True

    def console_batch(self, key: str, lines: list[str]) -> list[str] | None:
        """A run's new console lines; the lines as shown, None where the run is not known."""
        run = self.runs.get(key)
        if run is None:
            return None
        # What a terminal shows of each line, no more than screen.LINE_CAP of it: text
        # drawn, never a control sequence (what the log shows is inert).
        shown = [screen.visible_text(line) for line in lines]
        run.log.extend(shown)
        # What the console says (loss, step, progress, the curve) is read until step events
        # arrive: then metrics.jsonl says it, and the console's lines are only shown. Once
        # a listing has read the run's output (`info.console`), its lines are only shown.
        if not run.steps and run.info.console is None:
            run.own_console.add_recorded("".join(f"{line}\n" for line in lines))  # console.log is the pane's bytes
        return shown

    def overlays_read(self, key: str, overlays: dict, drop: str | None) -> bool:
        """Runs to draw behind run `key` (`drop`: one to draw no longer); False where the
        run is not known."""
        run = self.runs.get(key)
        if run is None:
            return False
        kept = {k: o for k, o in run.overlays.items() if k != drop}
        kept.update(overlays)
        run.overlays = kept
        return True

    def selected_run(self, key: str) -> None:
        """Run `key` opened on a run screen (or launched from here): followed."""
        self.selected.add(key)

    def deselected_run(self, key: str) -> None:
        self.selected.discard(key)

    def edited(self, key: str, changes: dict) -> None:
        """The operator's edit of run `key`'s params, kept for its relaunch."""
        self.pending[key] = changes

    def adopted(self, info: runs.RunInfo) -> RunState:
        """A run launched from here: known before the next listing lists it."""
        home = self.home_of(info)
        key = run_key(home, info)
        run = self.runs.setdefault(key, RunState(key, info.host, info, home=home))
        run.info = info
        return run

    def relaunched(self, key: str) -> None:
        """Run `key` relaunched: its edit is spent."""
        self.pending.pop(key, None)

    def kill_started(self, key: str) -> None:
        """A kill of run `key` is about to signal: the end it causes is no news (marked
        before, as the listing may see the end before the kill returns)."""
        self.alert_book.stopped(key)
        self.stopped_runs.add(key)

    def kill_failed(self, key: str) -> None:
        """The kill failed: it answers for nothing, and the run's own end must be told."""
        self.alert_book.stop_failed(key)
        self.stopped_runs.discard(key)

    def killed(self, key: str, report: KillReport) -> None:
        """Run `key` stopped from here: memory still held is an alert per host (a
        multi-node run's other nodes report their own), memory freed takes its alert down."""
        if run := self.runs.get(key):
            run.stopped_here = True
        for part in (report, *report.nodes):
            where = key if part is report else f"{key} on {part.host}"
            alert = kill_alert(where, part)
            if alert:
                self.kill_alerts[alert.key] = alert
            else:
                self.kill_alerts.pop(f"held:{where}", None)

    def _answered(self, host: HostState, time: float) -> bool:
        back = host.status.lost
        host.status, host.message, host.last_ok = HostStatus.OK, "", time
        return back

    # --- what follows from the state ------------------------------------------------

    def home_of(self, info: runs.RunInfo) -> str:
        """The host a run is filed under (its key's): a multi-node run's first node on a
        watched host, so its key holds while its metrics' host is still being found."""
        return next((n.host for n in info.nodes if n.host in self.hosts), info.host)

    def followed(self, host_name: str) -> dict[str, RunState]:
        """The runs of a host whose files are followed: the running ones with a run dir,
        and any on screen, even while it reads as gone, so a listing that raced its launch
        cannot restart its stream."""
        return {
            key: run
            for key, run in self.runs.items()
            if run.host == host_name
            and (key in self.selected or (not run.gone and run.info.run_dir and run.info.state.name == "RUNNING"))
        }

    def new_alerts(self, now: float) -> list[Alert]:
        """Alerts evaluated at `now`: those raised since the last evaluation; `alerts`
        holds every one up now."""
        hosts = [
            HostFacts(
                host.name,
                host.message if host.status.lost else None,
                [(r, host.traces[r.index].underfed_since) for r in (host.gpus.gpus if host.gpus else ()) if r.index in host.traces],
            )
            for host in self.hosts.values()
        ]
        listed = [RunFacts(run.key, run.info, run.steps, run.oom, run.metrics.nonfinite) for run in self.runs.values() if not run.gone]
        raised = self.alert_book.evaluate(hosts, listed, now, [*self.kill_alerts.values(), *self._lost_nodes(listed)])
        self.alerts = {alert.key: alert for alert in self.alert_book.current}
        return raised

    def _lost_nodes(self, listed: list[RunFacts]) -> list[Alert]:
        """A multi-node run with a dead node, named. Only said: stopping the nodes left
        waiting on it is `trackside watch`'s, which supervises whether a dashboard is open
        or not (a dashboard's poll is a read that never stops anything)."""
        parents = {run.info.parent for run in listed if run.info.parent}
        found = []
        for run in listed:
            if not run.info.nodes or run.key in self.stopped_runs or run.info.run_id in parents:
                continue  # the operator stopped or relaunched it: its end is no news
            alert = nodes.node_alert(run.info)
            if alert is not None and self.alert_book.watches(run):
                found.append(alert)
        return found
