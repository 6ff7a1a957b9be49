"""The fleet: every host and every run on it, in one table updated in place."""

from __future__ import annotations

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import DataTable, Input

from backends.alerts import UNDERFED_POWER
from backends.config import Defaults
from backends.gpu import GpuSnapshot, GpuStatus
from backends.runs.status import RunStatus
from tui import energy
from tui.keys import KEYS, RUN_ACTIONS
from tui.state import HostState, HostStatus, RunState, format_duration, format_number, node_label
from tui.widgets.alert_bar import AlertBar
from tui.widgets.footer import Footer
from tui.widgets.title_bar import TitleBar
from tui.guard import Guarded
from tui.inert import inert

# (key, label, width): fixed widths keep the table on screen; a host's full error is in
# the alert bar, the power column takes what is left.
COLUMNS = [
    ("name", "host / run", 20),
    ("state", "state", 22),
    ("msl", "max_seq_len", 11),
    ("ttt", "TTT/τ", 5),  # EAGLE-3's TTT steps; a DFlash run's τ, tokens accepted per block
    ("step", "step", 24),
    ("loss", "loss", 7),
    ("tps", "tokens/s", 8),
    ("eta", "ETA", 7),
    ("gpuh", "GPU-h", 7),  # GPU-hours so far, from the host's recording (tui/energy.py)
    ("kwh", "kWh", 7),  # energy so far
    ("power", "GPU power (W of limit)", None),
]
# A narrower terminal shows fewer columns, never one cut at its edge (80 columns showed
# five, the step cut, and scrolling to the loss hid the run id). What 80 columns keep, at
# these widths (the step alone, without its place in its epoch); then, as they fit, in
# this order: a column, or a kept one at its full width.
NARROW = {"name": 20, "state": 18, "step": 8, "loss": 7, "eta": 7}
ADDED = ("tps", "power", "step", "state", "msl", "ttt", "gpuh", "kwh")
POWER_WIDTH = 38  # eight cards' draws and their limit: `250 257 … 299 /600 W`
PADDING = 2  # a DataTable cell's, both sides


def shown_columns(room: int) -> dict[str, int | None]:
    """The columns shown in `room` cells and their widths, in COLUMNS' order."""
    full = {key: width for key, _, width in COLUMNS}
    widths: dict[str, int] = dict(NARROW)
    used = sum(width + PADDING for width in widths.values())
    for key in ADDED:
        width = full[key] or POWER_WIDTH
        more = width - widths[key] if key in widths else width + PADDING
        if used + more <= room:
            widths[key], used = width, used + more
    return {key: (widths[key] if full[key] else None) for key, _, _ in COLUMNS if key in widths}


def power_summary(host: HostState) -> Text | str:
    """Each card's draw, red under half its limit, then the limit: `250 257 … /600 W`."""
    readings = host.gpus.gpus if host.gpus else ()
    if not readings:
        return "—"
    text = Text()
    for r in readings:
        if r.power_w is None or not r.power_limit_w:
            text.append("? ")
            continue
        text.append(f"{r.power_w:.0f}", style="red" if r.power_w < UNDERFED_POWER * r.power_limit_w else "green")
        text.append(" ")
    limits = {r.power_limit_w for r in readings if r.power_limit_w}
    text.append(f"/{limits.pop():.0f} W" if len(limits) == 1 else "W")
    return text


# The power column is the table's last and narrowest: a GPU state in a few words (the
# whole message is on the host's run screens), never a sentence cut mid-word.
GPU_STATES = {
    GpuStatus.NO_GPU: "no GPU",
    GpuStatus.NO_SMI: "no nvidia-smi",
    GpuStatus.DRIVER_ERROR: "GPU driver error",
    GpuStatus.ERROR: "GPUs unreadable",
}


def gpu_state(snapshot: GpuSnapshot) -> str:
    return GPU_STATES.get(snapshot.status, snapshot.status.value)


def host_cells(host: HostState, now: float, interval: float) -> dict[str, object]:
    status = host.status
    stale = host.stale_for(now, interval)
    if status is HostStatus.OK and stale is not None:
        label = Text(f"stale ({format_duration(stale)})", style="yellow")
    else:
        label = Text(status, style=status.style)
    gpu_note = gpu_state(host.gpus) if host.gpus is not None and not host.gpus.ok else ""
    if host.message:
        # In the row's widest cell: the state column cut it to "offline: connection re".
        message = host.message.removeprefix(f"{host.name}: ")  # the row already names the host
        gpu_note = Text(message, style="red")  # a message comes only with a failure
    return {
        "name": Text(host.name, style="bold"),
        "state": label,
        "msl": "",
        "ttt": "",
        "step": "",
        "loss": "",
        "tps": "",
        "eta": "",
        "gpuh": "",
        "kwh": "",
        "power": gpu_note or power_summary(host),
    }


def run_cells(run: RunState, host: HostState) -> dict[str, object]:
    params = run.params
    label = Text(run.state_label, style=run.style)
    if run.progress is not None and not run.steps and run.status is RunStatus.RUNNING:
        label.append(f" {run.progress.done}/{run.progress.total}")
    if run.status is RunStatus.STOP_INTERRUPTED:
        label.append(" · k finishes it")
    if run.info.this_dashboard:
        label = Text("this dashboard", style="bold blue")
    gpu_hours, kwh = energy.cells(run)
    return {
        "name": Text(f"  {run.info.run_id or run.info.session}"),
        "state": label,
        "msl": format_number(params.get("max_seq_len")),
        "ttt": f"τ{format_number(run.tau, 2)}" if run.is_dflash else format_number(params.get("ttt_steps")),
        "step": run.step_text if run.x_word == "step" else f"{run.x_word} {run.step_text}",
        "step_alone": run.step_counted,  # the step column's text where it is narrow
        "loss": format_number(run.loss, width=7),
        "tps": format_number(run.tokens_per_s),
        "eta": format_duration(run.eta_s()),
        "gpuh": gpu_hours,
        "kwh": kwh,
        "power": Text(run.info.unreadable, style=run.style) if run.info.unreadable else "",  # why, in the widest cell
    }


def node_cells(run: RunState, index: int) -> dict[str, object]:
    """A multi-node run's node, under the run's row: its host and its own state."""
    node = run.info.nodes[index]
    label, style = node_label(node, run.info.end_status)
    branch = "└" if index == len(run.info.nodes) - 1 else "├"
    return {
        "name": Text(f"   {branch} {node.host}"),
        "state": Text(label, style=style),
        **dict.fromkeys(("msl", "ttt", "step", "loss", "tps", "eta", "gpuh", "kwh", "power"), ""),
    }


def row_run_key(row_key: str) -> str | None:
    """The run a fleet row stands for: a run's row, or one of its nodes' rows."""
    if row_key.startswith("run:"):
        return row_key[len("run:"):]
    if row_key.startswith("node:"):
        return row_key[len("node:"):].rpartition("#")[0]
    return None


class FleetScreen(Guarded, Screen):
    AUTO_FOCUS = "#fleet"

    def compose(self) -> ComposeResult:
        yield TitleBar()
        yield AlertBar(id="alerts")
        yield Input(placeholder="filter hosts and runs (Enter to keep, Esc to clear)", id="filter")
        yield DataTable(id="fleet", cursor_type="row", zebra_stripes=True)
        yield Footer()

    composed = False  # the app may report changes between push and compose
    columns: dict[str, int | None] = {}  # the columns shown and their widths

    def on_mount(self) -> None:
        self.composed = True
        self.sub_title = "fleet"
        self.query_one("#filter").display = False
        self.rebuild()

    def on_resize(self, event: events.Resize) -> None:
        if self.composed:
            self.rebuild()

    def on_unmount(self) -> None:
        self.composed = False

    def on_screen_resume(self) -> None:
        self.state_changed()

    def selected_run_key(self) -> str | None:
        table = self.query_one(DataTable)
        if not table.row_count:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        return row_run_key(key or "")

    def rows(self) -> list[tuple[str, dict]]:
        """Hosts in config order, each followed by its runs (newest first); a run spanning
        hosts once, under its first node's host, each node on a row of its own below it."""
        app = self.app
        now = app.clock()
        interval = next(iter(app.monitors.values())).interval if app.monitors else Defaults.poll_ms / 1000
        needle = self.query_one("#filter", Input).value.strip().lower()
        rows = []
        for host in app.hosts.values():
            runs = sorted(
                (r for r in app.runs.values() if r.home == host.name),
                key=lambda r: (r.info.started or "", r.key),
                reverse=True,
            )
            if needle:
                runs = [r for r in runs if needle in r.key.lower() or needle in r.state_label.lower()
                        or any(needle in name.lower() for name in r.hosts)]  # fmt: skip
                if not runs and needle not in host.name.lower():
                    continue
            rows.append((f"host:{host.name}", host_cells(host, now, interval)))
            for r in runs:
                rows.append((f"run:{r.key}", run_cells(r, host)))
                if len(r.info.nodes) > 1:
                    rows.extend((f"node:{r.key}#{i}", node_cells(r, i)) for i in range(len(r.info.nodes)))
        return rows

    def rebuild(self) -> None:
        """Update the table in place; re-add rows only when the set of rows (or of the
        columns the screen's width shows) changed."""
        table = self.query_one(DataTable)
        scrollbar = table.styles.scrollbar_size_vertical if table.show_vertical_scrollbar else 0
        columns = shown_columns(self.size.width - scrollbar)
        rows = [(key, self._shown(cells, columns)) for key, cells in self.rows()]
        current = [key.value for key in table.rows]
        if current == [key for key, _ in rows] and columns == self.columns:
            for key, cells in rows:
                for column, value in cells.items():
                    if str(table.get_cell(key, column)) != str(value):
                        table.update_cell(key, column, inert(value))
            self.app.refresh_bindings()
            return
        selected = self.query_one(DataTable).cursor_row
        selected_key = current[selected] if 0 <= selected < len(current) else None
        table.clear(columns=columns != self.columns)
        if columns != self.columns:
            for key, label, _ in COLUMNS:
                if key in columns:
                    table.add_column(label, key=key, width=columns[key])
            self.columns = columns
        for key, cells in rows:
            table.add_row(*(inert(cell) for cell in cells.values()), key=key)  # names and params are anyone's
        keys = [key for key, _ in rows]
        if selected_key not in keys or not any(k.startswith("run:") for k in current):
            # Until the user has runs to choose from, start on the first run: the keys act there.
            selected_key = next((k for k in keys if k.startswith("run:")), selected_key)
        if selected_key in keys:
            table.move_cursor(row=keys.index(selected_key))
        self.app.refresh_bindings()

    @staticmethod
    def _shown(cells: dict[str, object], columns: dict[str, int | None]) -> dict[str, object]:
        """A row's cells in the columns shown: the step alone where its column is narrow."""
        narrow = columns.get("step") == NARROW["step"] and "step_alone" in cells
        return {key: cells["step_alone" if key == "step" and narrow else key] for key in columns}

    def state_changed(self, *, host=None, run=None, events=(), lines=()) -> None:
        if not self.composed or (run is not None and not events):
            return  # console lines change no cell here that the once-a-second tick misses
        self.query_one(AlertBar).show(list(self.app.alerts.values()))
        self.rebuild()

    def on_key(self, event: events.Key) -> None:
        # A run key on a host row: its binding is disabled there, so Textual lets the key
        # through in silence; say what it needs.
        table = self.query_one(DataTable)
        if not table.row_count or self.selected_run_key() is not None:
            return
        host = (table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value or "").removeprefix("host:")
        for binding in KEYS:
            if binding.action in RUN_ACTIONS and event.key in binding.key.split(","):
                if self.app.action_allowed(binding.action, self) is None:  # not a read-only dashboard's hidden key
                    has_runs = any(run.home == host for run in self.app.runs.values())
                    self.notify(f"select a run: {binding.description} acts on a run, not on host {host}"
                                + ("" if has_runs else " (it has none)"), timeout=5)  # fmt: skip
                return

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        # Only while the fleet is in view: an Enter pressed twice selected the row twice
        # before the first run screen was up, and stacked a run screen on a run screen.
        if self.app.screen is self and (key := row_run_key(event.row_key.value or "")):
            self.app.open_run(key)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self.app.refresh_bindings()

    def action_filter(self) -> None:
        # None while the screen is still being mounted or taken down: the palette's Filter,
        # run by one of several Enters in one breath, came then (CI, once).
        for box in self.query("#filter").results(Input):
            box.display = True
            box.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        self.rebuild()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.query_one(DataTable).focus()

    def key_escape(self) -> None:
        box = self.query_one("#filter", Input)
        if box.display:
            box.value = ""
            box.display = False
            self.query_one(DataTable).focus()
