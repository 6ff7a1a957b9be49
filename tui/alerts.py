"""Alert rules: from state to the short sentences an operator must not miss.

Each alert has a key, so the same condition is announced once (a notification when it
first appears) and listed in the alert bar while it lasts.
"""

from __future__ import annotations

from dataclasses import dataclass

from tui.state import HostState, RunState, RunStatus, format_duration

UNDERFED_POWER = 0.5  # of the power limit
UNDERFED_UTIL = 90.0  # percent
UNDERFED_FOR_S = 60.0
STALL_S = 300.0


@dataclass(frozen=True)
class Alert:
    key: str
    text: str
    severity: str = "warning"  # warning | error | information


def update_underfed(host: HostState, now: float) -> None:
    """Track, per GPU, since when it has drawn under half its limit while reading busy."""
    for reading in host.gpus.gpus if host.gpus else ():
        trace = host.traces.get(reading.index)
        if trace is None:
            continue
        busy = reading.util_pct is not None and reading.util_pct > UNDERFED_UTIL
        starved = (
            reading.power_w is not None
            and reading.power_limit_w
            and reading.power_w < UNDERFED_POWER * reading.power_limit_w
        )
        if busy and starved:
            if trace.underfed_since is None:
                trace.underfed_since = now
        else:
            trace.underfed_since = None


def host_alerts(host: HostState, now: float) -> list[Alert]:
    alerts = []
    if host.status.lost:
        alerts.append(Alert(f"lost:{host.name}", f"{host.name} lost: {host.message}", "error"))
    starved = [
        (reading, now - host.traces[reading.index].underfed_since)
        for reading in (host.gpus.gpus if host.gpus else ())
        if reading.index in host.traces
        and host.traces[reading.index].underfed_since is not None
        and now - host.traces[reading.index].underfed_since >= UNDERFED_FOR_S
    ]
    if starved:
        watts = [r.power_w for r, _ in starved]
        drawn = f"{min(watts):.0f}" if min(watts) == max(watts) else f"{min(watts):.0f}–{max(watts):.0f}"
        alerts.append(
            Alert(
                f"underfed:{host.name}",
                f"under-fed GPU{'s' if len(starved) > 1 else ''} {','.join(str(r.index) for r, _ in starved)} "
                f"on {host.name}: {drawn} W of {starved[0][0].power_limit_w:.0f} W at >{UNDERFED_UTIL:.0f}% util "
                f"for {format_duration(max(s for _, s in starved))} — give each step more work",
            )
        )
    return alerts


def run_alerts(run: RunState, now: float) -> list[Alert]:
    alerts = []
    if run.oom:
        params = ", ".join(
            f"{k}={run.oom[k]}" for k in ("max_seq_len", "ttt_steps", "tried_gib", "peak_mem_gib") if k in run.oom
        )
        alerts.append(Alert(f"oom:{run.key}", f"{run.key} ran out of GPU memory ({params})", "error"))
    last = run.last_step_time()
    if run.status is RunStatus.RUNNING and last is not None and now - last > STALL_S:
        alerts.append(
            Alert(f"stall:{run.key}", f"{run.key} stalled: no step for {format_duration(now - last)}")
        )
    return alerts


def kill_alert(key: str, report) -> Alert | None:
    """Memory still held after a kill, naming each straggler."""
    if report.released and not report.stragglers:
        return None
    held = "; ".join(
        f"PID {p.pid} ({p.name}) holds {p.used_mib} MiB on GPU {p.gpu_index}" for p in report.stragglers
    ) or "GPU memory not released"
    return Alert(f"held:{key}", f"after killing {key}: {held}", "error")
