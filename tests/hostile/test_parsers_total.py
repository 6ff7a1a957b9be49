"""The parsers of what other processes write, beyond the console's (test_parsers_linear.py):
a /proc stat record, nvidia-smi's CSV, a tmux pane record, untrusted JSON and a manifest.
Random, huge and pathological text never raises anything but the parser's own refusal,
and costs CPU time linear in its length (each huge input within BUDGET_S).
"""

from __future__ import annotations

import json
import math
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backends import tmux, untrusted_json
from backends.gpu.smi import parse_compute_apps, parse_query_gpu
from backends.procs import parse_stat
from backends.runs.manifest import ManifestError, parse_manifest

LONG = 40_000
BUDGET_S = 1.0
RUN_ID = "20261204-1200-ab12"
SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def within_budget(parse, text: str) -> None:
    started = time.process_time()
    try:
        parse(text)
    except ValueError:  # the parsers' own refusal (ManifestError is one)
        pass
    spent = time.process_time() - started
    assert spent < BUDGET_S, f"{spent:.2f} s of CPU for {len(text)} characters"


def stat_line(pid: int, comm: str, ppid: int = 1, pgid: int = 7, sid: int = 7, started: int = 12345) -> str:
    # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime
    # stime cutime cstime priority nice threads itrealvalue starttime ...
    rest = ["S", ppid, pgid, sid, 0, -1, 4194560, *[0] * 8, 20, 0, 1, 0, started, 0, 0]
    return f"{pid} ({comm}) " + " ".join(map(str, rest))


@SETTINGS
@given(comm=st.text(max_size=64), pid=st.integers(1, 4_194_304), started=st.integers(0, 2**62))
def test_a_process_name_never_changes_what_its_stat_record_says(comm, pid, started):
    """A name may hold ')', '(', spaces and newlines: the fields after its last ')' are read."""
    proc = parse_stat(pid, stat_line(pid, comm, started=started))
    assert proc is not None and (proc.pid, proc.ppid, proc.pgid, proc.sid, proc.started) == (pid, 1, 7, 7, started)
    assert proc.command == comm


@SETTINGS
@given(text=st.text(max_size=400), pid=st.integers(1, 99999))
def test_random_stat_text_is_a_process_or_none(text, pid):
    proc = parse_stat(pid, text)
    assert proc is None or proc.pid == pid


@SETTINGS
@given(text=st.text(max_size=2000))
def test_random_nvidia_smi_output_never_raises(text):
    for reading in parse_query_gpu(text):
        for value in (reading.power_w, reading.power_limit_w, reading.mem_used_mib, reading.mem_total_mib):
            assert value is None or math.isfinite(value)
    parse_compute_apps(text, {"GPU-0": 0})


@SETTINGS
@given(text=st.text(max_size=400))
def test_random_text_is_no_pane_record_unless_tmux_could_have_written_it(text):
    match = tmux._RECORD.fullmatch(text)
    assert match is None or (match.group(1).startswith("%") and "\n" not in text)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=12), inner, max_size=6),
    max_leaves=30,
)
MANIFEST_KEYS = ["run_id", "session", "host", "argv", "params", "started", "ended", "exit_status", "pane_pid",
                 "run_dir", "trainer", "parent", "nodes", "node", "code", "synced"]  # fmt: skip


def finite_everywhere(value) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(map(finite_everywhere, value))
    if isinstance(value, dict):
        return all(map(finite_everywhere, value.values()))
    return True


@SETTINGS
@given(value=JSON)
def test_untrusted_json_reads_no_number_that_is_not_finite(value):
    text = json.dumps(value)  # NaN and Infinity written as Python's json writes them
    assert finite_everywhere(untrusted_json.loads(text))


@SETTINGS
@given(fields=st.dictionaries(st.sampled_from(MANIFEST_KEYS), JSON, max_size=8))
def test_any_manifest_is_read_or_refused_by_name(fields):
    try:
        manifest = parse_manifest(json.dumps(fields), RUN_ID)
    except ManifestError as error:
        assert str(error)
    else:
        assert isinstance(manifest, dict) and finite_everywhere(manifest)


HUGE = {
    "closing parentheses": ")" * LONG,
    "opening parentheses": "(" * LONG,
    "spaced digits": "1 " * (LONG // 2),
    "commas": "," * LONG,
    "brackets": "[" * LONG,
    "braces": '{"a":' * (LONG // 5),
    "digits": "9" * LONG,
    "exponent": "1e" + "9" * LONG,
    "percents": "%" * LONG,
    "record-like": "%1 $1 " * (LONG // 6),
    "csv-like": "0, GPU-0, 100.0 W, " * (LONG // 20),
}


@pytest.mark.parametrize("text", HUGE.values(), ids=HUGE.keys())
def test_each_parser_reads_huge_hostile_text_in_linear_time(text):
    within_budget(lambda t: parse_stat(1, t), text)
    within_budget(parse_query_gpu, text)
    within_budget(lambda t: parse_compute_apps(t, {"GPU-0": 0}), text)
    within_budget(tmux._RECORD.fullmatch, text)
    within_budget(untrusted_json.loads, text)
    within_budget(lambda t: parse_manifest(t, RUN_ID), text)
