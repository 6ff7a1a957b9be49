"""Shared fixtures: a real OpenSSH sshd on 127.0.0.1 (`sshd`, shared by the session;
`fresh_sshd`, a private one for tests that stop or sever it), an SSHHost pointed at the
shared one (`ssh_host`), and a temporary runs root (`runs_root`).

The session owns every process and file it makes, whatever the environment: it runs with
a HOME and a tmux directory of its own, here and in the test sshd's sessions, removed at
its end, and fails if a test left a tmux server running there."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

# One thread per torch: two test workers on two cores already fill the machine, and each
# trainer a test starts (in tmux, inheriting this) would otherwise spread over both cores
# against the workers. Set before anything imports torch.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402

from scripts.local_box import end_tmux_server
from tests.sshd import Sshd, sshd_available

# The session's own HOME: a dashboard watching only SSH hosts writes its error log under
# ~/.trackside/runs, the trainer its data cache under ~/.cache, `trackside` reads
# ~/.config. And its own tmux directory, for every server a test starts without one of its
# own: a test's tmux socket over SSH is then the socket its cleanup ends here (with the
# user's TMUX_TMPDIR here and sshd's default there, a 100,000-step trainer outlived the
# suite). Variables that would point either back at the user's are dropped. xdist's
# workers share the run's HOME (its synthetic data is made once), each its own tmux
# directory (its check at its end sees its own servers only). Set when pytest starts,
# not on import: a script importing these helpers keeps its own environment.
OWN_HOME = "TRACKSIDE_TESTS_HOME"
OWN: dict[str, str] = {}  # HOME and TMUX_TMPDIR, once pytest_configure has made them


def pytest_configure(config):
    home = os.environ.get(OWN_HOME) or tempfile.mkdtemp(prefix="ts-home-")
    if OWN_HOME not in os.environ:
        OWN["made"] = home  # removed by this process; a worker's is its controller's
    OWN.update(HOME=home, TMUX_TMPDIR=tempfile.mkdtemp(prefix="ts-tmux-", dir="/tmp"))  # a socket's path fits in 107 bytes
    os.environ.update({"HOME": OWN["HOME"], OWN_HOME: OWN["HOME"], "TMUX_TMPDIR": OWN["TMUX_TMPDIR"]})
    # The dashboard's tests' mode: an unexpected error ends the app, and its test fails on
    # the traceback (tui.guard); the tests of surviving one say raise_errors=False.
    from tui.guard import RAISE_ERRORS_ENV

    os.environ[RAISE_ERRORS_ENV] = "1"
    for name in ("TMUX", "TMUX_PANE", "TRACKSIDE_RUNS_ROOT", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME"):
        os.environ.pop(name, None)


# The slowest tests, slowest first (docs/testing.md, "What takes time"): each starts first
# on a worker of its own, not last on one worker while the others sit idle. Then every
# other `slow` test, then the rest, each in collection order.
SLOWEST = (
    "tests/tui/test_monkey.py::test_random_keys_under_pilot_never_stop_the_dashboard[80x24]",
    "tests/tui/test_monkey.py::test_random_keys_in_a_tmux_pane_never_stop_trackside_demo",
    "tests/training/test_checkpoint.py::test_kill_9_at_random_moments_then_resume_continues_exactly",
    "tests/tui/test_monkey.py::test_random_keys_under_pilot_never_stop_the_dashboard[160x48]",
    "tests/training/test_train.py::test_synthetic_200_steps_meet_the_contract_and_learn",
    "tests/hostile/test_kill_bystander.py::test_sshd_gone_mid_kill_leaves_a_stop_the_next_listing_shows",
    "tests/backends/test_multinode.py::test_two_nodes_train_as_two_processes_stop_together_relaunch_and_lose_one",
    "tests/training/test_release_first.py::test_kill_9_of_the_trainer_while_staging_or_of_the_writer_mid_write_leaves_whole_checkpoints",
)


def _shares_a_module_fixture(item) -> bool:
    defs = getattr(item, "_fixtureinfo", None)
    return bool(defs) and any(d[-1].scope == "module" for name, d in defs.name2fixturedefs.items() if d and name in item.fixturenames)


@pytest.hookimpl(trylast=True)  # after `-m`, `-k` and the like deselected theirs
def pytest_collection_modifyitems(config, items):
    """Slowest first, for `--dist worksteal` (scripts/test.sh): its workers each take an
    equal run of the collection, in order, and a worker with nothing left steals the back
    half of the longest queue. So the slow tests are dealt one to each run's front, where
    they start at once and are never what is stolen; each worker collects, and all deal
    the same (the count of workers is theirs as well). A module's tests that share a
    module-scoped fixture (a recorded past, a built model) are dealt as one, at a front:
    split between workers, or stolen in half, each part would build it again."""
    rank = {node_id: i for i, node_id in enumerate(SLOWEST)}
    groups: dict[str, list] = {}
    for item in items:
        if item.nodeid not in rank and _shares_a_module_fixture(item):
            groups.setdefault(item.nodeid.split("::")[0], []).append(item)
    grouped = {id(i) for group in groups.values() for i in group}
    slow = sorted((i for i in items if i.nodeid in rank or (i.get_closest_marker("slow") and id(i) not in grouped)),
                  key=lambda i: rank.get(i.nodeid, len(rank)))
    units = [[i] for i in slow if i.nodeid in rank] + list(groups.values()) + [[i] for i in slow if i.nodeid not in rank]
    chosen = {id(i) for unit in units for i in unit}
    rest = [i for i in items if id(i) not in chosen]
    workers = int(getattr(config, "workerinput", {}).get("workercount", 1))
    # The run each worker is sent: xdist's split, pending // workers left, in turn.
    sizes, left = [], len(items)
    for n in range(workers, 0, -1):
        sizes.append(left // n)
        left -= sizes[-1]
    runs: list[list] = [[] for _ in range(workers)]
    for n, unit in enumerate(units):
        runs[n % workers].extend(unit)
    for run, size in zip(runs, sizes):
        take = max(0, size - len(run))
        run.extend(rest[:take])
        del rest[:take]
    items[:] = [i for run in runs for i in run] + rest


def pytest_unconfigure(config):
    shutil.rmtree(OWN.get("made", ""), ignore_errors=True)
    shutil.rmtree(OWN.get("TMUX_TMPDIR", ""), ignore_errors=True)


def own_sessions(server: Sshd) -> Sshd:
    """The server's sessions get the session's HOME and tmux directory (sshd gives them
    the user's home from the password file, and no TMUX_TMPDIR). sshd reads only the
    first SetEnv line of its config: they join it."""
    config = server.config.read_text()
    server.config.write_text(config.replace("SetEnv ", f"SetEnv HOME={OWN['HOME']} TMUX_TMPDIR={OWN['TMUX_TMPDIR']} ", 1))
    return server


def live_tmux_servers(directory: str) -> list[str]:
    """The sockets under a TMUX_TMPDIR that a tmux server still answers on."""
    sockets = [os.path.join(root, name) for root, _, names in os.walk(directory) for name in names]
    return [s for s in sockets if subprocess.run(["tmux", "-S", s, "list-sessions"], capture_output=True).returncode == 0]


@pytest.fixture(scope="session", autouse=True)
def no_tmux_server_left():
    """Set up first, torn down last: any tmux server still running in the session's tmux
    directory was left by a test. It is ended, and the session fails naming it."""
    yield
    left = live_tmux_servers(OWN["TMUX_TMPDIR"])
    for socket in left:
        end_tmux_server("tmux", "-S", socket)
    assert not left, f"tests left tmux servers running (ended now): {', '.join(left)}"


def need_sshd() -> None:
    if not sshd_available():
        pytest.skip("OpenSSH sshd is not installed (/usr/sbin/sshd); SSH tests need a real server")


@pytest.fixture(scope="session")
def sshd(tmp_path_factory):
    """The session's sshd (see tests/sshd.py). Tests that stop or sever it restart it."""
    need_sshd()
    server = own_sessions(Sshd(tmp_path_factory.mktemp("sshd")))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def fresh_sshd(tmp_path):
    """A started sshd of this test's own (new port and keys), stopped after it."""
    need_sshd()
    server = own_sessions(Sshd(tmp_path / "sshd"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
async def ssh_host(sshd):
    """An SSHHost on the session's sshd; its connection is closed after the test."""
    if not sshd.running:
        sshd.start()
    host = sshd.host()
    yield host
    await host.close()


@pytest.fixture
def runs_root(tmp_path):
    """A fresh runs root directory (absolute path, as a str) for run directories."""
    root = tmp_path / "runs"
    root.mkdir()
    return str(root)


# Lines a test records as `record_property("summary", …)` (the monkey tests' seed, key
# count and duration), printed at the end of the run: with or without xdist workers.
SUMMARIES: list[str] = []


def pytest_runtest_logreport(report):
    if report.when == "call":
        SUMMARIES.extend(str(value) for name, value in report.user_properties if name == "summary")


def pytest_terminal_summary(terminalreporter):
    if SUMMARIES:
        terminalreporter.section("summaries")
        for line in SUMMARIES:
            terminalreporter.write_line(line)

