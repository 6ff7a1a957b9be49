"""The GPU recorder (backends/recorder/), tried as an attacker would: session and process
names, a pid that is not the process the GPU listing named, hostile files and links under
`gpu/`, a runs root others could change, log paths that leave the runs root, and runs
roots whose names are shell. The recorder runs for real (its tmux session, its inline
program) against the nvidia-smi stand-in; the reader reads over the Host API."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest

from backends import runsroot
from backends.hosts import LocalHost
from backends.recorder import layout, start
from backends.recorder.read import Gap, parse_recording, read_recording
from tests.backends.test_runs import tmux_dir  # noqa: F401 - the fixture: this test's own tmux server
from tests.hostile.test_tmux_edge import escaped, tmux_out
from tests.waiting import until
from tui.cli import main

FAKE_SMI = str(Path(__file__).resolve().parents[1] / "fake_nvidia_smi.py")
FAST = start.Settings(tick_s=0.2, loop_ms=200)
T0 = 1793836800.0  # 2026-11-05 00:00:00 UTC, in the past
DAY = layout.day_of(T0)
UUID = "GPU-00000000-1111-2222-3333-444444444444"


def rows(*lines: str) -> bytes:
    return "".join(f"{line}\n" for line in lines).encode()


@pytest.fixture
def local(tmux_dir, tmp_path):  # noqa: F811
    """This machine as a host whose runs root is the test's, on this test's tmux server."""
    host = LocalHost("box", runs_root=str(tmp_path / "runs"))
    yield host
    asyncio.run(start.recorder(host, "stop", FAKE_SMI))


def today(root: str | Path, kind: str) -> Path:
    return Path(root) / "gpu" / layout.file_name(layout.day_of(time.time()), kind)


def lines_of(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except (FileNotFoundError, UnicodeDecodeError):
        return []


def ticks_after(root: str | Path, t: float) -> int:
    return sum(1 for line in lines_of(today(root, "ticks")) if (layout.parse_time(line.split(",")[0]) or 0) > t)


def recording(host, since: float):
    return asyncio.run(read_recording(host, since))


def new_session(name: str, *command: str) -> str:
    """A session on this test's server; its name as tmux lists it (tmux 3 escapes controls)."""
    made = subprocess.run(["tmux", "-u", "new-session", "-d", "-P", "-F", "#{session_id}", "-s", escaped(name), *command],
                          capture_output=True, check=True)  # fmt: skip
    out = subprocess.run(["tmux", "-u", "display-message", "-p", "-t", made.stdout.decode().strip(), "#{session_name}"],
                         capture_output=True, check=True)  # fmt: skip
    return out.stdout.decode(errors="surrogateescape").removesuffix("\n")


def config_file(tmp_path: Path, root: str, smi: str = FAKE_SMI) -> str:
    path = tmp_path / "config.toml"
    path.write_text(f"[hosts.box]\nruns_root = {json.dumps(root)}\nnvidia_smi = {json.dumps(smi)}\n")
    return str(path)


# --- session names -------------------------------------------------------------------------

HOSTILE_NAMES = [
    "line\nbreak",
    "comma,4242,forged",
    "\x1b]52;c;cHduZWQ=\x07osc",
    "$(touch {x})",
    "`touch {x}`",
    "quote'\"both",
    "tab\there",
    "\udcff\udcfeinvalid utf-8",
    "名前",
    "n" * 10_000,
]


def test_hostile_session_names_are_recorded_read_back_and_printed_inert(local, tmp_path, capsys, tmux_dir):  # noqa: F811
    x = Path(tmux_dir) / "PWNED"
    listed = {new_session(raw.replace("{x}", str(x)), "sleep", "600") for raw in HOSTILE_NAMES}
    began = time.time()
    assert asyncio.run(start.recorder(local, "start", FAKE_SMI, FAST)) == "started"
    until(lambda: ticks_after(local.runs_root, began + 1), 60, "the recorder's ticks")

    def sessions():
        rec = recording(local, began)
        return {p.session for p in rec.panes_at(time.time())} - {start.session_of(local.runs_root)}

    # Every name as tmux lists it, each exactly, on a line of its own: but the one too long
    # for a line of the recording, which is not said (never cut short into another's).
    readable = {name for name in listed if len(name) < 1000}
    until(lambda: sessions() == readable, 30, "every session read back")
    assert not x.exists()
    for line in lines_of(today(local.runs_root, "panes")):
        assert line.isascii() and line.isprintable()

    config = config_file(tmp_path, local.runs_root)
    assert main(["record", "status", "--config", config]) == 0
    assert main(["watch", "--since", "1h", "--config", config]) in (0, 1)
    out = capsys.readouterr()
    for text in (out.out, out.err):
        assert "\x1b" not in text and "\x07" not in text
    assert out.out.splitlines()[0] == f"box: running ({local.runs_root}/gpu/)"
    assert not x.exists()


def test_a_name_too_long_to_record_does_not_keep_an_ended_session_alive(local, tmux_dir):  # noqa: F811
    """The snapshot with only a session whose name no line can hold is still a snapshot:
    the session that ended before it is not read as still there."""
    new_session("train", "sleep", "600")
    began = time.time()
    assert asyncio.run(start.recorder(local, "start", FAKE_SMI, FAST)) == "started"
    until(lambda: "train" in {p.session for p in recording(local, began).panes_at(time.time())}, 60, "the train session recorded")
    new_session("n" * 10_000, "sleep", "600")
    killing = time.time()
    subprocess.run(["tmux", "kill-session", "-t", "=train"], check=True)
    ended = time.time()
    until(lambda: ticks_after(local.runs_root, ended + 1), 30, "ticks after train ended")
    rec = recording(local, began)
    assert [p.session for p in rec.panes_at(time.time())] == [start.session_of(local.runs_root)]
    # A snapshot taken since the kill, not one left from before it. Since the kill began:
    # one can be taken between the session's end and this test's reading of the clock
    # (a fresh clone's CI run saw it 4 ms before), and times are written to 10 ms.
    assert rec.pane_times[-1] >= killing - 0.01


# --- processes -----------------------------------------------------------------------------


def test_a_process_name_forging_stat_fields_gives_its_real_parents(local, tmp_path):
    """/proc/PID/stat's name may hold `) S 1 1`: the fields are read after its last `)`."""
    forger = tmp_path / ") S 1 1 1 1"
    forger.symlink_to("/bin/sleep")
    holder = subprocess.Popen([str(forger), "600"])
    try:
        procs = tmp_path / "procs.json"
        procs.write_text(json.dumps([{"pid": holder.pid, "gpu": 0, "used_mib": 5000}]))
        smi = tmp_path / "nvidia-smi"
        smi.write_text(f"#!/bin/sh\nFAKE_NVIDIA_SMI_PROCS={procs} exec {sys.executable} -S {FAKE_SMI} \"$@\"\n")
        smi.chmod(0o755)
        began = time.time()
        assert asyncio.run(start.recorder(local, "start", str(smi), FAST)) == "started"
        rec = until(lambda: (r := recording(local, began)).procs and r, 60, "the holder recorded")
        ticks = int(Path(f"/proc/{holder.pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        assert {(p.pid, p.start_ticks, p.ancestors[0]) for p in rec.procs} == {(holder.pid, ticks, os.getpid())}
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("listed", ["started after the listing", "gone before its /proc is read"])
def test_a_pid_that_is_not_the_listed_process_is_not_charged_as_it(local, tmp_path, listed):
    """nvidia-smi names pid P; by the time the recorder reads /proc/P, P may be a newer
    process (the listed one ended, its pid reused), or gone. The stand-in's wrapper models
    both: the pid it lists is of a process it starts after the listing began, or of one
    that has exited."""
    late = tmp_path / "late.pid"
    smi = tmp_path / "nvidia-smi"
    process = "sleep 0.1; sleep 600 >/dev/null 2>&1 &" if listed.startswith("started") else "true & wait;"
    smi.write_text(
        "#!/bin/sh\n"
        'case "$1" in --query-compute-apps=*)\n'
        f"  {process} echo $! >> {late}\n"
        f'  echo "{UUID}, $!, 5000"; exit 0 ;;\n'
        "esac\n"
        f'exec {sys.executable} -S {FAKE_SMI} "$@"\n'
    )
    smi.chmod(0o755)
    began = time.time()
    try:
        assert asyncio.run(start.recorder(local, "start", str(smi), FAST)) == "started"
        until(lambda: ticks_after(local.runs_root, began + 1) >= 3, 60, "ticks")
        until(lambda: len(lines_of(late)) >= 3, 60, "listings")
        rec = recording(local, began)
        # Its row says what the listing said, and no start nor parents of another process.
        assert rec.procs and {(p.start_ticks, p.ancestors, p.used_mib) for p in rec.procs} == {(None, (), 5000.0)}
    finally:
        asyncio.run(start.recorder(local, "stop", FAKE_SMI))
        for pid in lines_of(late):
            subprocess.run(["kill", pid], capture_output=True)


# --- files under gpu/ ----------------------------------------------------------------------


def test_a_fifo_named_as_a_day_file_blocks_neither_the_recorder_nor_the_reader(local):
    gpu = Path(local.runs_root) / "gpu"
    gpu.mkdir(parents=True, mode=0o700)
    Path(local.runs_root).chmod(0o700)
    os.mkfifo(today(local.runs_root, "procs"), 0o600)  # the recorder's own next write
    os.mkfifo(gpu / layout.file_name(layout.day_of(time.time()), "logs", True), 0o600)
    began = time.time()
    assert asyncio.run(start.recorder(local, "start", FAKE_SMI, FAST)) == "started"
    until(lambda: ticks_after(local.runs_root, began) >= 5, 30, "ticks past the FIFO")
    rec = until(lambda: (r := asyncio.run(asyncio.wait_for(read_recording(local, began), 30))).gpus and r, 30, "GPU samples")
    assert rec.procs == () and rec.proc_times == ()


def test_links_dirs_and_odd_names_under_gpu_are_never_read(local, tmp_path):
    gpu = Path(local.runs_root) / "gpu"
    gpu.mkdir(parents=True, mode=0o700)
    Path(local.runs_root).chmod(0o700)
    real = gpu / f"{DAY}.gpu"
    real.write_bytes(rows(f"{T0:.2f},0,{UUID}", f"{T0 + 1:.2f},0,100,700,1,2,3"))
    real.chmod(0o600)
    secret = tmp_path / "shadow"
    secret.write_bytes(rows(f"{T0 + 2:.2f},7,666,700,1,2,3"))
    (gpu / f"{DAY}.gpu.1m").symlink_to(secret)
    (gpu / f"{DAY}.ticks").symlink_to("/etc/shadow")
    (gpu / f"{DAY}.procs").symlink_to(real)  # a link to another of ours
    (gpu / f"{DAY}.panes").mkdir()
    (gpu / f"{DAY}.logs").symlink_to(tmp_path)
    for odd in (f"{DAY}.gpu.bak", f"{DAY}.gpu~", f"{DAY}.gpu.1m.1m", f".{DAY}.gpu", f"{DAY}.GPU"):
        (gpu / odd).write_bytes(secret.read_bytes())
    rec = asyncio.run(read_recording(local, T0 - 10, T0 + 10))
    assert [(g.index, g.power_w) for g in rec.gpus] == [(0, 100.0)]
    assert rec.procs == rec.panes == rec.logs == ()


def test_a_huge_sparse_day_costs_the_reader_bounded_time_and_memory(local):
    gpu = Path(local.runs_root) / "gpu"
    gpu.mkdir(parents=True, mode=0o700)
    Path(local.runs_root).chmod(0o700)
    with open(gpu / f"{DAY}.gpu", "wb") as f:
        f.write(rows(f"{T0:.2f},0,{UUID}", f"{T0 + 1:.2f},0,100,700,1,2,3"))
        f.truncate(2 << 30)  # 2 GiB of zeros after, no newline
    (gpu / f"{DAY}.gpu").chmod(0o600)
    started = time.monotonic()
    rec = asyncio.run(read_recording(local, T0 - 10, T0 + 10))
    assert time.monotonic() - started < 60
    assert [g.power_w for g in rec.gpus] == [100.0]


def test_a_huge_sparse_old_day_is_downsampled_in_bounded_memory(local):
    gpu = Path(local.runs_root) / "gpu"
    gpu.mkdir(parents=True, mode=0o700)
    old = time.time() - 10 * 86400
    name = layout.file_name(layout.day_of(old), "gpu")
    with open(gpu / name, "wb") as f:
        f.write(rows(f"{old:.2f},0,{UUID}", f"{old:.2f},0,100,700,1,2,3"))
        f.truncate(2 << 30)
    (gpu / name).chmod(0o600)
    assert asyncio.run(start.recorder(local, "start", FAKE_SMI, FAST)) == "started"
    coarse = gpu / layout.file_name(layout.day_of(old), "gpu", True)
    until(coarse.exists, 60, "the old day downsampled")
    pane = int(tmux_out("list-panes", "-t", f"={start.session_of(local.runs_root)}:", "-F", "#{pane_pid}"))
    peak_kib = next(int(line.split()[1]) for line in Path(f"/proc/{pane}/status").read_text().splitlines() if line.startswith("VmHWM:"))
    assert peak_kib < 1 << 20, f"the recorder held {peak_kib >> 10} MiB"
    assert [line.split(",")[2] for line in lines_of(coarse) if line.count(",") == 6] == ["100.00"]


SHORT_LINES = {
    "empty lines": b"\n",
    "short numbers": b"12\n",
    "junk": b"x\n",
    "a line of 100 MB": None,
}


@pytest.mark.parametrize("what", SHORT_LINES)
def test_the_parser_is_linear_in_time_and_holds_little_more_than_its_input(what):
    def data(n: int) -> bytes:
        unit = SHORT_LINES[what]
        return b"7" * n + b"\n" if unit is None else unit * (n // len(unit))

    def cost(n: int) -> float:
        files = {f"{DAY}.{kind}": data(n) for kind in layout.KINDS}
        started = time.process_time()
        parse_recording(files, T0, None)
        return time.process_time() - started

    small, large = 1 << 20, 10 << 20
    cost(small)  # warm
    assert cost(large) <= 12 * max(cost(small), 0.01)
    files = {f"{DAY}.{kind}": data(large) for kind in layout.KINDS}
    tracemalloc.start()
    try:
        parse_recording(files, T0, None)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 * large, f"{peak / 2**20:.0f} MiB held for {5 * large / 2**20:.0f} MiB read"
    if what == "a line of 100 MB":
        started = time.process_time()
        parse_recording({f"{DAY}.gpu": data(100 << 20)}, T0, None)
        assert time.process_time() - started < 10


def test_hostile_numbers_and_times_are_skipped_and_samples_come_in_time_order():
    gpu = [f"{T0:.2f},0,{UUID}"]
    good = [f"{T0 + s:.2f},0,{100 + s},700,1,2,3" for s in (10, 20, 30)]
    bad = [
        f"{T0 + 11:.2f},0,nan,700,1,2,3", f"{T0 + 12:.2f},0,inf,700,1,2,3", f"{T0 + 13:.2f},0,-5,700,1,2,3",
        f"{T0 + 14:.2f},0,1e308,700,1,2,3", f"{T0 + 15:.2f},0,{'9' * 309},700,1,2,3", f"{T0 + 16:.2f},0,1,700,1,2,101",
        "1e308,0,1,700,1,2,3", "nan,0,1,700,1,2,3", f"-{T0:.2f},0,1,700,1,2,3", "1.0e9,0,1,700,1,2,3",
    ]  # fmt: skip
    data = rows(*gpu, good[0], *bad, good[2], good[1])  # a clock stepped back: 30 before 20
    rec = parse_recording({f"{DAY}.gpu": data}, T0, None)
    assert [g.time for g in rec.gpus] == [T0 + 10, T0 + 20, T0 + 30]


def test_samples_stamped_in_the_future_are_not_read_as_now(local):
    gpu = Path(local.runs_root) / "gpu"
    gpu.mkdir(parents=True, mode=0o700)
    Path(local.runs_root).chmod(0o700)
    now = time.time()
    (gpu / f"{layout.day_of(now)}.gpu").write_bytes(
        rows(f"{now - 5:.2f},0,{UUID}", f"{now - 5:.2f},0,100,700,1,2,3", f"{now + 3600:.2f},0,999,700,1,2,3")
    )
    (gpu / f"{layout.day_of(now)}.gpu").chmod(0o600)
    assert [g.power_w for g in recording(local, now - 60).gpus] == [100.0]


@pytest.mark.parametrize("name", ["9999-99-99.gpu.1m", "2026-02-31.ticks.1m", "٢٠٢٦-١١-٠٥.gpu.1m", "2026-11-05.gpu\n"])
def test_a_day_file_named_like_ours_but_no_day_is_skipped(name):
    good = {f"{DAY}.gpu": rows(f"{T0:.2f},0,{UUID}", f"{T0 + 1:.2f},0,100,700,1,2,3")}
    rec = parse_recording({**good, name: rows(f"{T0 + 2:.2f},0,666,700,1,2,3")}, T0, None)
    assert [g.power_w for g in rec.gpus] == [100.0] and rec.coarse_before is None


# --- the log-size index --------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    ["../../etc/shadow", "/etc/shadow", "r1/../../x", "./r1/console.log", "r1//console.log", "r1/console.log/..",
     "gpu/console.log", "r1/other.log", "panes/s/x/../../../y.log", "r1\\x00/console.log", ""],
)  # fmt: skip
def test_the_log_index_never_names_a_path_outside_the_runs_root(path):
    data = rows(f"{T0:.2f},5,{path}", f"{T0:.2f},6,r1/console.log", f"{T0:.2f},7,panes/default/train-1/0.log")
    rec = parse_recording({f"{DAY}.logs": data}, T0 - 1, None)
    assert [e.path for e in rec.logs] == ["r1/console.log", "panes/default/train-1/0.log"]


def test_the_recorder_indexes_no_link_and_the_reader_returns_what_it_indexed(local, tmp_path):
    root = Path(local.runs_root)
    (root / "r1").mkdir(parents=True)
    (root / "r1" / "console.log").write_text("x" * 10)
    (root / "r2").mkdir()
    (root / "r2" / "console.log").symlink_to("/etc/shadow")
    (root / "r3").symlink_to(tmp_path)
    (tmp_path / "console.log").write_text("outside")
    began = time.time()
    assert asyncio.run(start.recorder(local, "start", FAKE_SMI, FAST)) == "started"
    rec = until(lambda: (r := recording(local, began)).logs and r, 60, "the log index")
    assert [(e.path, e.size) for e in rec.logs] == [("r1/console.log", 10)]


# --- who may change the runs root ----------------------------------------------------------


@pytest.mark.parametrize("hostile", ["gpu/ sticky and writable by all", "root sticky and writable by all",
                                     "gpu/ writable by its group", "gpu/ another user's"])  # fmt: skip
def test_a_recording_others_could_change_is_refused(local, hostile):
    root, gpu = Path(local.runs_root), Path(local.runs_root) / "gpu"
    gpu.mkdir(parents=True, mode=0o700)
    root.chmod(0o700)
    (gpu / f"{DAY}.gpu").write_bytes(rows(f"{T0:.2f},0,{UUID}", f"{T0 + 1:.2f},0,100,700,1,2,3"))
    (gpu / f"{DAY}.gpu").chmod(0o600)
    if hostile == "gpu/ sticky and writable by all":
        gpu.chmod(0o1777)
    elif hostile == "root sticky and writable by all":
        root.chmod(0o1777)
    elif hostile == "gpu/ writable by its group":
        gpu.chmod(0o770)
    else:
        os.chown(gpu, 65534, 65534)
    with pytest.raises(runsroot.RunsRootRefused):
        asyncio.run(read_recording(local, T0 - 10, T0 + 10))


def test_a_held_mark_that_is_a_link_holds_nothing_and_stop_makes_none_through_it(local, tmp_path):
    """`record stop` holds a recorder stopped with a directory under gpu/: one planted as a
    link (to a directory) is no hold, and a stop neither trusts it nor is refused by it."""
    gpu = Path(local.runs_root) / "gpu"
    gpu.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (gpu / start.HELD).symlink_to(elsewhere)
    for _ in range(2):
        assert asyncio.run(start.recorder(local, "ensure", FAKE_SMI, FAST)) == "started"
        assert asyncio.run(start.recorder(local, "stop", FAKE_SMI)) == "stopped"
    assert (gpu / start.HELD).is_symlink() and list(elsewhere.iterdir()) == []
    (gpu / start.HELD).unlink()
    assert asyncio.run(start.recorder(local, "ensure", FAKE_SMI, FAST)) == "started"
    assert asyncio.run(start.recorder(local, "stop", FAKE_SMI)) == "stopped"
    assert (gpu / start.HELD).is_dir() and not (gpu / start.HELD).is_symlink()
    assert asyncio.run(start.recorder(local, "ensure", FAKE_SMI, FAST)) == "held"


def test_gpu_swapped_for_a_link_while_it_records_is_never_written_through(local, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    began = time.time()
    assert asyncio.run(start.recorder(local, "start", FAKE_SMI, FAST)) == "started"
    until(lambda: ticks_after(local.runs_root, began) >= 2, 60, "ticks")
    session = start.session_of(local.runs_root)
    assert subprocess.run(["tmux", "has-session", "-t", f"={session}"], capture_output=True).returncode == 0
    gpu = Path(local.runs_root) / "gpu"
    gpu.rename(Path(local.runs_root) / "moved")
    gpu.symlink_to(elsewhere)
    # Its gpu/ is no longer the directory it writes into: it ends at its next tick
    # (writing on into the moved one, never through the link, until then).
    until(lambda: subprocess.run(["tmux", "has-session", "-t", f"={session}"], capture_output=True).returncode != 0, 30, "the recorder to end")
    assert list(elsewhere.iterdir()) == []
    with pytest.raises(runsroot.RunsRootRefused, match="symbolic link"):
        recording(local, began)


# --- the inline program and its arguments --------------------------------------------------


@pytest.mark.parametrize("name", ["with space", "q'uo\"te", "$(touch {x})", "`touch {x}`", "#{session_name}", "-dash",
                                  "esc\x1b]0;title\x07\x1b[2J", "/".join(["d" * 250] * 15), "ends;", "ends\\;"])  # fmt: skip
def test_a_runs_root_named_as_shell_is_one_argument(tmp_path, tmux_dir, capsys, name):  # noqa: F811
    x = tmp_path / "PWNED"
    root = tmp_path / name.replace("{x}", str(x))
    host = LocalHost("box", runs_root=str(root))
    began = time.time()
    try:
        assert asyncio.run(start.recorder(host, "start", FAKE_SMI, FAST)) == "started"
        until(lambda: recording(host, began).gpus, 60, "GPU samples in the runs root named so")
        (tmp_path / "config").mkdir()
        assert main(["record", "status", "--config", config_file(tmp_path / "config", str(root))]) == 0
        said = capsys.readouterr().out
        assert said.count("\n") == 1 and said.startswith("box: running (") and "\x1b" not in said and "\x07" not in said
    finally:
        asyncio.run(start.recorder(host, "stop", FAKE_SMI))
    assert not x.exists() and sorted(p.name for p in tmp_path.iterdir()) == sorted({root.relative_to(tmp_path).parts[0], "config"})


def test_a_runs_root_at_home_is_expanded_there(tmp_path, tmux_dir, monkeypatch):  # noqa: F811
    monkeypatch.setenv("HOME", str(tmp_path))
    host = LocalHost("box", runs_root="~/runs")
    began = time.time()
    try:
        assert asyncio.run(start.recorder(host, "start", FAKE_SMI, FAST)) == "started"
        until(lambda: ticks_after(tmp_path / "runs", began) >= 2, 60, "ticks under ~/runs")
    finally:
        asyncio.run(start.recorder(host, "stop", FAKE_SMI))
    assert not (Path.cwd() / "~").exists()


def test_a_runs_root_with_a_line_break_is_refused_not_checked_in_pieces(tmp_path, tmux_dir):  # noqa: F811
    """The checks read paths one a line: a name with a line break would be checked as two
    paths that do not exist, and pass."""
    root = tmp_path / "x\n/etc"
    root.mkdir(parents=True)
    root.chmod(0o777)  # others could plant what root then writes through
    host = LocalHost("box", runs_root=str(root))
    with pytest.raises(runsroot.RunsRootRefused, match="line break"):
        asyncio.run(start.recorder(host, "start", FAKE_SMI, FAST))
    with pytest.raises(runsroot.RunsRootRefused, match="line break"):
        asyncio.run(runsroot.check(host, str(root)))
    assert not (root / "gpu").exists()


def test_the_inline_program_fits_tmux_with_the_longest_runs_root():
    """tmux refuses a command over 16 KiB: the program, inline, with a root of PATH_MAX."""
    longest = "/" + "r" * 4094
    command = [start.PYTHON, "-c", start._BOOT, longest, "a-socket", "/usr/bin/nvidia-smi", "5", "1000", "7", str(1 << 30)]
    assert sum(len(part.encode()) + 1 for part in command) < 16 * 1024 - 1024


def test_a_day_written_twice_reads_as_the_day_once():
    """A day file appended to itself (two recorders on one runs root, a copy restored onto
    it): each sample and each snapshot's row once, so nothing is charged twice."""
    from tests.backends.test_recorder_read import day_files

    once = day_files()
    twice = {name: data + data for name, data in once.items()}
    a, b = parse_recording(once, T0, None), parse_recording(twice, T0, None)
    assert (b.gpus, b.procs, b.panes, b.proc_times, b.pane_times) == (a.gpus, a.procs, a.panes, a.proc_times, a.pane_times)
    assert b.procs_at(T0 + 399) == a.procs_at(T0 + 399) and len(b.panes_at(T0 + 599)) == 2


def test_a_day_file_it_cannot_remove_leaves_the_recorder_recording(local):
    """Rotation meets a file it cannot remove (immutable here; gone since, elsewhere): the
    recorder goes on, for a recorder that died is a gap nobody sees until the next command."""
    gpu = Path(local.runs_root) / "gpu"
    gpu.mkdir(parents=True, mode=0o700)
    old = time.time() - 10 * 86400
    stuck = gpu / layout.file_name(layout.day_of(old), "gpu")
    stuck.write_bytes(rows(f"{old:.2f},0,{UUID}", f"{old:.2f},0,100,700,1,2,3"))
    stuck.chmod(0o600)
    subprocess.run(["chattr", "+i", str(stuck)], check=True)
    try:
        began = time.time()
        assert asyncio.run(start.recorder(local, "start", FAKE_SMI, FAST)) == "started"
        until(lambda: ticks_after(local.runs_root, began) >= 5, 30, "ticks after the rotation")
        assert stuck.exists()
    finally:
        subprocess.run(["chattr", "-i", str(stuck)], check=True)


def test_a_tick_stamped_in_the_future_hides_no_gap_up_to_now():
    """A clock stepped forward then back (or a forged line) leaves a tick after now: the
    recorder that stopped is still a gap up to now, not up to that tick."""
    from tests.backends.test_recorder_read import day_files

    files = day_files()
    files[f"{DAY}.ticks"] += rows(f"{T0 + 7200:.2f}")
    assert parse_recording(files, T0, None, now=T0 + 3600).gaps[-1] == Gap(T0 + 595, T0 + 3600)
