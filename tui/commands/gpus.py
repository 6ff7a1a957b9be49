"""`trackside gpus`: one reading of each host's GPUs (backends/gpu/), what the
dashboard's GPU panel shows: power against its limit, memory, utilisation, temperature,
and the processes holding memory."""

from __future__ import annotations

import dataclasses

from backends import gpu
from backends.hosts import Host, HostError
from backends.reach import everywhere
from tui.commands.shared import Fleet, table


def add_parser(command) -> None:
    command("gpus", "Read the host's GPUs once: power against its limit, memory, utilisation, "
                    "temperature, and the processes holding memory (what the dashboard's GPU panel shows).")  # fmt: skip


def _gpus_json(snapshot: gpu.GpuSnapshot) -> dict:
    return {"status": snapshot.status.value, "message": snapshot.message, "source": snapshot.source,
            "gpus": [dataclasses.asdict(g) for g in snapshot.gpus],
            "processes": [dataclasses.asdict(p) for p in snapshot.processes]}  # fmt: skip


def _show_gpus(host: str, snapshot: gpu.GpuSnapshot) -> str:
    if not snapshot.ok:
        return f"{host}: {snapshot.message or snapshot.status.value}"

    def of(value, limit, unit: str, scale: float = 1.0, digits: int = 0) -> str:
        shown = [f"{v / scale:.{digits}f}" if v is not None else "?" for v in (value, limit)]
        return f"{shown[0]}/{shown[1]} {unit}"
    rows = [("GPU", "NAME", "POWER", "MEMORY", "UTIL", "TEMP")]
    for g in snapshot.gpus:
        rows.append((str(g.index), g.name or "-", of(g.power_w, g.power_limit_w, "W"),
                     of(g.mem_used_mib, g.mem_total_mib, "GiB", 1024, 1),
                     f"{g.util_pct}%" if g.util_pct is not None else "-",
                     f"{g.temp_c}°C" if g.temp_c is not None else "-"))  # fmt: skip
    lines = table(rows).splitlines()
    lines += [f"PID {p.pid} ({p.name or '?'}) holds {p.used_mib if p.used_mib is not None else '?'} MiB"
              + (f" on GPU {p.gpu_index}" if p.gpu_index is not None else "") for p in snapshot.processes]  # fmt: skip
    return "\n".join(lines + [f"read by {snapshot.source}"] if snapshot.source else lines)


async def run(args, fleet: Fleet) -> tuple[dict | list, str, list[str]]:
    async def read(host: Host) -> gpu.GpuSnapshot:
        snapshot = await gpu.read_gpus(host, fleet.smis[host.name])
        if snapshot.status in (gpu.GpuStatus.ERROR, gpu.GpuStatus.DRIVER_ERROR):
            raise HostError(host.name, snapshot.message or snapshot.status.value)
        return snapshot

    readings, unread = await everywhere(fleet.names, fleet.hosts, read)
    if len(fleet.names) == 1:
        [(name, snapshot)] = readings.items()
        return _gpus_json(snapshot), _show_gpus(name, snapshot), unread
    docs = [{"host": name, **_gpus_json(snapshot)} for name, snapshot in readings.items()]
    return docs, "\n\n".join(f"{name}:\n{_show_gpus(name, snapshot)}" for name, snapshot in readings.items()), unread
