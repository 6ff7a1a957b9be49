"""A run's GPU-hours and energy so far, as the fleet and the run screen say them: from the
charges its hosts' recordings gave (backends/recorder/energy.py), or why there are none."""

from __future__ import annotations

from backends.recorder.energy import Charge
from tui.state import RunState, format_number

# The fleet's cells for a run without figures: why, in a column's few letters (the run
# screen says it in words).
SHORT = {"off": "rec off", "none": "no rec", "reading": "…"}
AT_LEAST = "≥"  # some of its time the recording could not say: more than this
SPLIT = "÷"  # a card it used held others' processes too: its share, by used memory


def charge_of(run: RunState) -> Charge | None:
    """Its charge over every host it runs on, once each has one."""
    said = [run.energy.get(host) for host in run.hosts]
    if not said or not all(isinstance(c, Charge) for c in said):
        return None
    total = Charge()
    for c in said:
        total += c
    return total


def why_none(run: RunState) -> tuple[str, str]:
    """(the short word, the words) for a run with no figures: its first host's reason."""
    for host in run.hosts:
        said = run.energy.get(host)
        if not isinstance(said, Charge):
            kind, words = said if said is not None else ("reading", f"reading the recording on {host}…")
            return SHORT[kind], words
    return SHORT["reading"], "reading the recording…"


def cells(run: RunState) -> tuple[str, str]:
    """The fleet's GPU-h and kWh cells: `≥1.23÷` at most 7 characters each."""
    c = charge_of(run)
    if c is None:
        word = why_none(run)[0]
        return word, word
    mark = AT_LEAST if c.at_least else ""
    split = SPLIT if c.shared else ""
    room = 7 - len(mark) - len(split)
    return (f"{mark}{format_number(c.gpu_hours, 3, width=room)}{split}",
            f"{mark}{format_number(c.kwh, 3, width=room)}{split}")  # fmt: skip


def line(run: RunState) -> str:
    """The run screen's line: `GPU 1.23 h  energy 0.45 kWh so far`, with what bounds it;
    empty until a reading of its host's recording has said anything."""
    c = charge_of(run)
    if not run.energy:
        return ""
    if c is None:
        return f"energy: {why_none(run)[1]}\n"
    mark = "at least " if c.at_least else ""
    said = f"GPU {mark}{format_number(c.gpu_hours, 3)} h  energy {mark}{format_number(c.kwh, 3)} kWh so far"
    if c.at_least:
        said += " (the recording misses some of its time)"
    if c.shared:
        said += " (a GPU shared with others' processes: split by used memory)"
    return f"{said}\n"
