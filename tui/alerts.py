"""Alert rules: from state to the short sentences an operator must not miss.

Each alert has a key, so the same condition is announced once (a notification when it
first appears) and listed in the alert bar while it lasts.
"""

from __future__ import annotations

from dataclasses import dataclass

from tui.state import HostState, RunState, format_duration

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
    for reading in getattr(host.gpus, "gpus", None) or []:
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
    if host.status in ("offline", "auth", "error"):
        alerts.append(Alert(f"lost:{host.name}", f"{host.name} lost: {host.message}", "error"))
    for reading in getattr(host.gpus, "gpus", None) or []:
        trace = host.traces.get(reading.index)
        if trace and trace.underfed_since is not None and now - trace.underfed_since >= UNDERFED_FOR_S:
            alerts.append(
                Alert(
                    f"underfed:{host.name}:{reading.index}",
                    f"under-fed GPU {host.name}:{reading.index}: {reading.power_w:.0f} W of "
                    f"{reading.power_limit_w:.0f} W at {reading.util_pct:.0f}% util for "
                    f"{format_duration(now - trace.underfed_since)} — more work per step",
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
    if run.state_label == "running" and last is not None and now - last > STALL_S:
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
