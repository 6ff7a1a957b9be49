"""The dashboard's reducer on plain data: no app, no Textual."""

from __future__ import annotations

import subprocess
import sys

from backends.alerts import AlertBook
from backends.gpu import GpuReading, GpuSnapshot, GpuStatus
from backends.runs import RunInfo, RunPhase
from tui.state import HostStatus
from tui.store import GONE_KEEP_S, Store

T = 1_000_000.0


def listed(*sessions: str, host: str = "box") -> list[RunInfo]:
    return [RunInfo(f"run-{s}", s, host, RunPhase.RUNNING, run_dir=f"/runs/run-{s}") for s in sessions]


def a_store() -> Store:
    return Store(["box"], AlertBook(since=T))


def test_the_store_imports_no_textual():
    code = "import sys, tui.store; print(sorted(m for m in sys.modules if m.split('.')[0] == 'textual'))"
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert found.strip() == "[]"


def test_a_run_gone_from_the_listing_is_kept_a_while_then_leaves_with_its_edit():
    store = a_store()
    store.runs_listed("box", listed("a", "b"), T)
    assert sorted(store.runs) == ["box/run-a", "box/run-b"]
    store.edited("box/run-b", {"ttt_steps": 3})
    store.runs_listed("box", listed("a"), T + 1)
    assert store.runs["box/run-b"].gone and store.runs["box/run-b"].gone_since == T + 1
    store.runs_listed("box", listed("a"), T + 1 + GONE_KEEP_S)
    assert "box/run-b" in store.runs  # not yet past the time kept
    store.runs_listed("box", listed("a"), T + 2 + GONE_KEEP_S)
    assert sorted(store.runs) == ["box/run-a"] and store.pending == {}


def test_a_run_on_screen_is_kept_and_followed_though_gone():
    store = a_store()
    store.runs_listed("box", listed("a", "b"), T)
    store.selected_run("box/run-b")
    store.runs_listed("box", listed("a"), T + 10 * GONE_KEEP_S)
    assert store.runs["box/run-b"].gone
    assert sorted(store.followed("box")) == ["box/run-a", "box/run-b"]
    store.deselected_run("box/run-b")
    assert sorted(store.followed("box")) == ["box/run-a"]


def test_a_lost_host_is_back_on_a_listing_not_on_a_gpu_error():
    store = a_store()
    store.host_failed("box", "offline", "box: connection refused")
    assert store.hosts["box"].status is HostStatus.OFFLINE
    assert store.new_alerts(T)[0].key == "lost:box"
    assert not store.gpus_polled("box", GpuSnapshot(GpuStatus.ERROR, "ssh: connection lost"), T + 1)
    assert store.hosts["box"].status is HostStatus.OFFLINE  # a GPU error may be the host's own loss
    assert store.runs_listed("box", [], T + 2)
    assert store.hosts["box"].status is HostStatus.OK and store.hosts["box"].last_ok == T + 2
    assert not store.runs_listed("box", [], T + 3)  # back once
    assert store.new_alerts(T + 3) == [] and "lost:box" not in store.alerts


def test_gpu_readings_make_each_cards_trace_and_its_underfed_start():
    store = a_store()
    busy_starved = GpuReading(0, power_w=250.0, power_limit_w=600.0, mem_used_mib=40960, util_pct=100)
    for t in (T, T + 1):
        store.gpus_polled("box", GpuSnapshot(GpuStatus.OK, gpus=(busy_starved,)), t)
    trace = store.hosts["box"].traces[0]
    assert list(trace.power_w) == [250.0, 250.0] and list(trace.mem_mib) == [40960, 40960]
    assert trace.underfed_since == T


def test_batches_for_an_unknown_run_change_nothing_and_lines_are_shown_as_text():
    store = a_store()
    assert not store.metrics_batch("box/run-a", [{"event": "step", "step": 1, "loss": 2.0}], 0)
    assert store.console_batch("box/run-a", ["x"]) is None
    store.runs_listed("box", listed("a"), T)
    assert store.metrics_batch("box/run-a", [{"event": "step", "step": 1, "loss": 2.0}], 2)
    run = store.runs["box/run-a"]
    assert run.step == 1 and run.garbled == 2
    assert store.console_batch("box/run-a", ["\x1b[1mbold\x1b[0m step"]) == ["bold step"]
    assert list(run.log) == ["bold step"]


def test_overlays_read_replace_and_drop():
    store = a_store()
    store.runs_listed("box", listed("a"), T)
    assert store.overlays_read("box/run-a", {"box/p": "parent", "box/g": "grandparent"}, None)
    assert store.overlays_read("box/run-a", {}, "box/g")
    assert store.runs["box/run-a"].overlays == {"box/p": "parent"}
    assert not store.overlays_read("box/run-z", {}, None)
