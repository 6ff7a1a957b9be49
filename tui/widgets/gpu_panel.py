"""Per GPU: power against its limit and memory against its total, with a power history."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Sparkline, Static

from backends.gpu import GpuStatus
from tui.state import HostState, HostStatus
from tui.guard import Guarded
from tui.inert import inert

BAR_WIDTH = 12


def bar(used: float | None, total: float | None, width: int = BAR_WIDTH) -> Text:
    """A fixed-width bar; green when the card is busy, red when it is starved or full."""
    if used is None or not total:
        return Text("▕" + "?" * width + "▏", style="dim")
    fraction = max(0.0, min(1.0, used / total))
    filled = round(fraction * width)
    return Text.assemble("▕", ("█" * filled, "bold"), ("░" * (width - filled), "dim"), "▏")


def power_bar(used: float | None, limit: float | None) -> Text:
    text = bar(used, limit)
    if used is not None and limit:
        text.stylize("red" if used < 0.5 * limit else "green", 1, 1 + BAR_WIDTH)
    return text


def memory_bar(used: float | None, total: float | None) -> Text:
    text = bar(used, total)
    if used is not None and total:
        text.stylize("red" if used > 0.95 * total else "cyan", 1, 1 + BAR_WIDTH)
    return text


def watts(value: float | None) -> str:
    return "—" if value is None else f"{value:.0f}"


def gib(mib: float | None) -> str:
    return "—" if mib is None else f"{mib / 1024:.1f}"


def gpu_line(reading, host: str = "") -> Text:
    """One card's line; `host` (padded) leads it when the panel shows several hosts' cards."""
    util = "—" if reading.util_pct is None else f"{reading.util_pct}%"
    temp = "" if reading.temp_c is None else f" {reading.temp_c}°C"
    return Text.assemble(
        (host, "bold"),
        (f"GPU{reading.index} ", "bold"),
        (f"{(reading.name or '').removeprefix('NVIDIA ')[:8]:<8} ", "dim"),
        power_bar(reading.power_w, reading.power_limit_w),
        f" {watts(reading.power_w):>4}/{watts(reading.power_limit_w)} W ",
        memory_bar(reading.mem_used_mib, reading.mem_total_mib),
        f" {gib(reading.mem_used_mib):>5}/{gib(reading.mem_total_mib)} GiB {util:>4}{temp}",
    )


def no_gpu_text(host: HostState, is_local: bool) -> str | None:
    """What to say instead of bars, or None when there are GPUs to show."""
    snapshot = host.gpus
    if host.status is not HostStatus.OK and snapshot is None:
        return f"{host.name}: {host.status} {host.message}".strip()
    if snapshot is None:
        return "reading GPUs…"
    where = "this machine" if is_local else host.name
    if snapshot.status in (GpuStatus.NO_GPU, GpuStatus.NO_SMI) and is_local:
        return f"no GPU on this machine ({snapshot.message})"
    if snapshot.status == GpuStatus.NO_GPU:
        return f"no GPU on {where} ({snapshot.message})"
    if snapshot.status != GpuStatus.OK:
        return f"GPUs on {where}: {snapshot.message}"
    return None


class GpuRow(Guarded, Horizontal):
    shown: Text | None = None  # the line on screen

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        # Held, not queried: a row may be updated again before it has composed.
        self.line = Static(classes="gpu-line")
        self.history = Sparkline([], classes="gpu-history")

    def compose(self) -> ComposeResult:
        yield self.line
        yield self.history

    def show(self, reading, history, host: str = "") -> None:
        line = inert(gpu_line(reading, host))
        if line != self.shown:
            # The line is sized to its text: only a change of width needs a layout pass,
            # which reflows and repaints the whole screen.
            self.line.update(line, layout=self.shown is None or line.cell_len != self.shown.cell_len)
            self.shown = line
        self.history.data = list(history)


class GpuPanel(Guarded, Vertical):
    """One GpuRow per card of each host shown (a multi-node run's every node's), updated
    in place; a plain sentence for a host with none to show."""

    def show(self, hosts: list[tuple[HostState, bool]]) -> int:
        """`hosts`: each host to show, with whether it is this machine. The lines shown."""
        named = len(hosts) > 1
        width = max(len(host.name) for host, _ in hosts) + 1 if named else 0
        wanted: list[tuple[str, type, tuple]] = []  # (row id, its widget's class, what it shows), in order
        for i, (host, is_local) in enumerate(hosts):
            message = no_gpu_text(host, is_local)
            if message is not None:
                if named and not message.startswith(f"{host.name}:"):
                    message = f"{host.name}: {message}"
                wanted.append((f"gpu-none-{i}", Static, (inert(message),)))  # a host's error, not markup
                continue
            for reading in host.gpus.gpus:
                trace = host.traces.get(reading.index)
                label = host.name.ljust(width) if named else ""
                wanted.append((f"gpu-{i}-{reading.index}", GpuRow, (reading, trace.power_w if trace else [], label)))
        shown = {child.id: child for child in self.children}
        previous = None
        for row_id, kind, args in wanted:
            row = shown.pop(row_id, None)
            if row is None:
                row = kind(id=row_id)
                if previous is not None:
                    self.mount(row, after=previous)
                elif self.children:
                    self.mount(row, before=0)
                else:
                    self.mount(row)
            elif previous is not None and self.children.index(row) != self.children.index(previous) + 1:
                self.move_child(row, after=previous)
            if isinstance(row, GpuRow):
                row.show(*args)
            else:
                row.update(*args)
            previous = row
        for row in shown.values():
            row.remove()
        return len(wanted)
