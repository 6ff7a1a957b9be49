"""The tmux edge, tried as an attacker would: session names that are tmux formats or
shell, a process whose argv[0] forges `list-panes` records, a dashboard's pane read as a
run. Each test runs the attack itself against a real tmux server of its own (TMUX_TMPDIR).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from backends import kill, runs, tmux
from backends.attach import attach_argv
from tests.backends.test_kill import FAKE_SMI
from tests.backends.test_runs import PY, eventually, host, tmux_dir, written  # noqa: F401 (fixtures)

TRACKSIDE = str(Path(PY).parent / "trackside")
REPO = Path(__file__).resolve().parents[2]


def tmux_out(*args: str, socket: str | None = None) -> str:
    """A trusted query of a test's server, in UTF-8 whatever the locale says (`-u`)."""
    where = ["-L", socket] if socket else []
    return subprocess.run(["tmux", *where, "-u", *args], capture_output=True, text=True, check=True).stdout


def through_edge(*args: str) -> str:
    """tmux with `args` as trackside gives them (tmux.tmux_argv)."""
    return subprocess.run(tmux.tmux_argv(None, "-u", *args), capture_output=True, text=True, check=True).stdout


def escaped(name: str) -> str:
    """`name` as new-session's -s must be given it, in this test's own words."""
    return name.replace("#", "##").removesuffix(";") + ("\\;" if name.endswith(";") else "")


def new_session(name: str, *command: str, socket: str | None = None) -> str:
    """A session named `name` (new-session expands formats in -s, so `#` is doubled
    here, and a final ';' would end the command); the name as tmux stores and lists it."""
    where = ["-L", socket] if socket else []
    done = subprocess.run(["tmux", *where, "-u", "new-session", "-d", "-P", "-F", "#{session_id}", "-s", escaped(name), *command],
                          capture_output=True, text=True, check=True)  # fmt: skip
    return tmux_out("display-message", "-p", "-t", done.stdout.strip(), "#{session_name}", socket=socket).removesuffix("\n")


def config_file(tmp_path: Path, runs_root: str) -> str:
    path = tmp_path / "config.toml"
    path.write_text(f"[hosts.box]\nruns_root = {json.dumps(runs_root)}\nnvidia_smi = {json.dumps(FAKE_SMI)}\n")
    return str(path)


def real_panes() -> set[tuple[str, int]]:
    """(session, pane pid) of every pane, one query per pane and field: nothing shares a line."""
    found = set()
    for pane_id in tmux_out("list-panes", "-a", "-F", "#{pane_id}").split():
        pid = tmux_out("display-message", "-p", "-t", pane_id, "#{pane_pid}").strip()
        session = tmux_out("display-message", "-p", "-t", pane_id, "#{session_name}").removesuffix("\n")
        found.add((session, int(pid)))
    return found


# --- 1. one quoting function for what tmux expands ---------------------------------------

HOSTILE = [";", "a;", "a\\;", "#(touch {x});", "#(touch {x})", "##(touch {x})", "#{session_name}", "#[fg=red]", "##[x]#(touch {x})", "###[", "#####(touch {x})", "#{?1,a,b}", "%d%H %%", "a#", "#", "100%", "it's \"q\" $(id)"]


async def test_literal_passes_every_text_through_tmux_unchanged(tmux_dir, tmp_path):
    x = Path(tmux_dir) / "X"
    new_session("base", "sleep", "600")
    for raw in HOSTILE:
        text = raw.replace("{x}", str(x))
        # -n: formats, no strftime.
        window = through_edge("new-window", "-d", "-P", "-F", "#{window_id}", "-t", "=base:", "-n", tmux.literal(text), "sleep", "600").strip()
        assert tmux_out("display-message", "-p", "-t", window, "#{window_name}") == text + "\n"
        # display -p and pipe-pane: formats, then strftime.
        assert through_edge("display-message", "-p", "-t", "=base:", tmux.literal(text, strftime=True)) == text + "\n"
        out = tmp_path / "piped"
        out.unlink(missing_ok=True)
        command = f"printf %s {shlex.quote(text)} > {shlex.quote(str(out))}.tmp && mv {shlex.quote(str(out))}.tmp {shlex.quote(str(out))}"
        through_edge("pipe-pane", "-t", "=base:", tmux.literal(command, strftime=True))
        assert await eventually(lambda: out.exists()) and written(out) == text
        tmux_out("pipe-pane", "-t", "=base:")
    assert not x.exists()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(alphabet="#%[](){},?:=ab \\'\"$;名", min_size=1, max_size=24))
def test_literal_holds_for_any_text(tmux_dir, text):
    if not subprocess.run(["tmux", "has-session", "-t", "=base"], capture_output=True).returncode == 0:
        new_session("base", "sleep", "600")
    window = through_edge("new-window", "-d", "-P", "-F", "#{window_id}", "-t", "=base:", "-n", tmux.literal(text), "sleep", "600").strip()
    assert tmux_out("display-message", "-p", "-t", window, "#{window_name}") == text + "\n"
    tmux_out("kill-window", "-t", window)
    assert through_edge("display-message", "-p", "-t", "=base:", tmux.literal(text, strftime=True)) == text + "\n"


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=";\\ab'\"$ \n", max_size=12))
def test_the_shells_tmux_argument_is_the_edges_own(text):
    """The recorder's start gives tmux its argv from a shell (tmux.SHELL_ARGUMENT): it
    writes each argument as tmux_argv does."""
    script = f'{tmux.SHELL_ARGUMENT}\ntmux_argument "$1"; printf %s "$a"'
    shell = subprocess.run(["sh", "-c", script, "sh", text], capture_output=True, text=True, check=True).stdout
    assert shell == tmux.tmux_argv(None, text)[1]


@pytest.fixture
def two_servers(tmux_dir):
    """The dashboard's tmux server (session `dash`) and another one, as a host's own
    `tmux_socket` would be: `a` opens a session of that one in a new window."""
    inner, other = f"ts-dash-{uuid.uuid4().hex[:6]}", f"ts-other-{uuid.uuid4().hex[:6]}"
    new_session("dash", "sleep", "600", socket=inner)
    yield inner, other
    for socket in (inner, other):
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True)


async def test_attach_from_inside_tmux_runs_nothing_a_session_name_says(two_servers, tmux_dir, tmp_path):
    inner, other = two_servers
    x = Path(tmux_dir) / "X"
    name = new_session(f"#(touch {x})", "sleep", "600", socket=other)
    assert name == f"#(touch {x})"
    out = tmp_path / "attach.out"
    code = (
        "import asyncio, sys; from backends.attach import attach_inside_tmux; from backends.hosts import LocalHost\n"
        "h = LocalHost(); h.tmux_socket = sys.argv[1]\n"
        "try: print(asyncio.run(attach_inside_tmux(h, sys.argv[2])))\n"
        "except Exception as e: print(type(e).__name__, e)\n"
    )
    script = f"cd {shlex.quote(str(REPO))} && {shlex.join([PY, '-c', code, other, name])} > {shlex.quote(str(out))} 2>&1; sleep 600"
    # The runner's command holds the name too: given to tmux as argv, never expanded.
    subprocess.run(["tmux", "-L", inner, "new-window", "-t", "=dash:", "-n", "runner", "--", "sh", "-c", script], check=True)
    said = await eventually(lambda: written(out).strip(), timeout=60)
    assert not x.exists()
    assert said == f"opened {name} in a new tmux window", said
    assert name in tmux_out("list-windows", "-t", "=dash", "-F", "#{window_name}", socket=inner).split("\n")


def test_attach_argv_holds_the_name_as_one_exact_target():
    from backends.hosts import LocalHost

    for name in ["#(touch X)", "a\\$b", "-dash", " spaced ", "名前"]:
        assert attach_argv(LocalHost(), name) == ["tmux", "attach-session", "-t", f"={name}"]
    assert attach_argv(LocalHost(), "x;") == ["tmux", "attach-session", "-t", "=x\\;"]  # tmux's own `;`, escaped
    assert attach_argv(LocalHost(), "$0", "$7") == ["tmux", "attach-session", "-t", "$7"]  # by the id tmux.target found


# --- 2. records no process can forge ----------------------------------------------------


async def test_a_forged_argv0_record_puts_no_other_sessions_pid_in_the_listing_or_the_kill_plan(host):
    new_session("B", "sleep", "600")
    victim = int(tmux_out("list-panes", "-t", "=B:", "-F", "#{pane_pid}"))
    created = tmux_out("display-message", "-p", "-t", "=B:", "#{session_created}").strip()
    # The rest of the line `list-panes -F` printed at 47d91dc after a newline in the
    # command (pid:dead:status:signal:pane_id:pipe:created:window:index:active:command;
    # tmux appends the real `:A`), and after a U+2028, where str.splitlines splits too.
    record = f"{victim}:0:::%99:0:{created}:0:0:11:sleep"
    forger = [PY, "-c", "import os, sys; os.execvp('sleep', [sys.argv[1], '600'])", f"x\n{record}:A\u2028{record}"]
    new_session("A", *forger)
    pane_a = int(tmux_out("list-panes", "-t", "=A:", "-F", "#{pane_pid}"))
    # tmux shows the forged argv[0] as the pane's command, raw.
    await eventually(lambda: "\n" in tmux_out("display-message", "-p", "-t", "=A:", "#{pane_current_command}").strip(), timeout=30)
    listed = {(p.session, p.pid) for p in await tmux.list_panes(host)}
    assert listed == real_panes() == {("A", pane_a), ("B", victim)}
    assert {p.pid for p in await tmux.list_panes(host, "A")} == {pane_a}
    plan = await kill.plan_kill(host, "A", smi=FAKE_SMI, nvml=False)
    assert plan.pane_pids == (pane_a,) and victim not in plan.tree


async def test_names_printed_over_more_lines_than_sessions_are_read_one_query_each(host):
    """tmux 3.x stores a name's newline escaped; an older one prints it raw, and a name
    could then print a line claiming another session's id: the count gives it away."""
    for name in ("one", "two"):
        new_session(name, "sleep", "600")
    ids = {name: tmux_out("display-message", "-p", "-t", f"={name}:", "#{session_id}").strip() for name in ("one", "two")}

    class OldTmux(type(host)):
        async def run(self, argv, **kwargs):
            result = await super().run(argv, **kwargs)
            if "list-sessions" in argv:  # `two` named "two\n$<one's id> evil"
                forged = result.stdout.replace(f"{ids['two']} two\n", f"{ids['two']} two\n{ids['one']} evil\n")
                assert forged != result.stdout
                result = type(result)(result.returncode, forged, result.stderr)
            return result

    old = OldTmux(runs_root=host.runs_root)
    assert sorted(p.session for p in await tmux.list_panes(old)) == ["one", "two"]


async def test_a_name_ending_in_a_semicolon_is_that_session_not_the_one_it_ends_with(host):
    # tmux ends a command at an argument ending in ';': `-t =victim;` would be `=victim`.
    new_session("victim", "sleep", "600")
    assert new_session("victim;", "sleep", "600") == "victim;"
    victim, evil = (int(tmux_out("list-panes", "-t", f"={name}:", "-F", "#{pane_pid}")) for name in ("victim", "victim;"))
    assert [p.pid for p in await tmux.list_panes(host, "victim;")] == [evil]
    assert (await kill.plan_kill(host, "victim;", smi=FAKE_SMI, nvml=False)).pane_pids == (evil,)
    assert await tmux.kill_session(host, "victim;")
    assert [p.pid for p in await tmux.list_panes(host)] == [victim]


async def test_a_name_that_reads_as_a_session_id_is_that_session_not_the_one_with_the_id(host):
    # tmux takes `=$0` for session id $0 (whatever its name): the first session made here.
    new_session("victim", "sleep", "600")
    assert new_session("$0", "sleep", "600") == "$0"
    victim, evil = (int(tmux_out("list-panes", "-t", session_id, "-F", "#{pane_pid}")) for session_id in ("$0", "$1"))
    assert [p.pid for p in await tmux.list_panes(host, "$0")] == [evil]
    assert (await kill.plan_kill(host, "$0", smi=FAKE_SMI, nvml=False)).pane_pids == (evil,)
    assert await tmux.target(host, "$0") == "$1"
    assert await tmux.kill_session(host, "$0")
    assert [p.pid for p in await tmux.list_panes(host)] == [victim]
    with pytest.raises(ValueError):
        tmux.exact("$0")  # never a target by name


# --- 3. any name tmux allows: listed, killed, attached, by exact match ------------------

NAMES = ["a$b", "$0", "$1 x", "#(touch {x})", "x;rm -rf y", "名前", " spaced ", "-dash", "=eq", "%d%H", "~t^c", "bystander;", ";"]


async def test_any_name_is_listed_and_killed_by_trackside_kill(host, tmux_dir, tmp_path, runs_root):
    x = Path(tmux_dir) / "X"
    names = [new_session(raw.replace("{x}", str(x)), "sleep", "600") for raw in NAMES]
    assert "a\\$b" in names and f"#(touch {x})" in names and "名前" in names  # as tmux stores them
    new_session("bystander", "sleep", "600")
    listed = [r.session for r in await runs.list_runs(host)]
    assert sorted(listed) == sorted([*names, "bystander"])
    config = config_file(tmp_path, runs_root)
    env = {**os.environ, "LC_ALL": "C", "LANG": "C"}  # a host whose locale is not UTF-8 (ssh often)
    kills = [subprocess.Popen([TRACKSIDE, "kill", "--config", config, "--json", "--", name], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for name in names]  # fmt: skip
    for name, proc in zip(names, kills):
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, (name, err)
        assert json.loads(out)["target"] == name
    assert [r.session for r in await runs.list_runs(host)] == ["bystander"]
    assert not x.exists()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(st.characters(exclude_characters="\x00", exclude_categories=("Cs",)), min_size=1, max_size=16) | st.text(alphabet="#;$0%:.\\\n\t\x1b名 =-~^{}()", min_size=1, max_size=12))
def test_any_name_tmux_stores_is_listed_and_is_a_target_to_it_alone(host, raw):
    import asyncio

    if subprocess.run(["tmux", "has-session", "-t", "=base"], capture_output=True).returncode:
        new_session("base", "sleep", "600")
    base = tmux_out("display-message", "-p", "-t", "=base:", "#{session_id}").strip()
    for session_id in set(tmux_out("list-sessions", "-F", "#{session_id}").split()) - {base}:  # an example that failed
        tmux_out("kill-session", "-t", session_id)
    made = subprocess.run(["tmux", "-u", "new-session", "-d", "-P", "-F", "#{session_id} #{pane_pid}", "-s", escaped(raw), "sleep", "600"],
                          capture_output=True, text=True)  # fmt: skip
    assume(made.returncode == 0)  # a name tmux stores as the first's (`a:b`, `a_b`)
    session_id, pid = made.stdout.split()
    name = tmux_out("display-message", "-p", "-t", session_id, "#{session_name}").removesuffix("\n")

    async def check():
        assert {p.session for p in await tmux.list_panes(host)} == {"base", name}
        assert [p.pid for p in await tmux.list_panes(host, name)] == [int(pid)]
        assert await tmux.kill_session(host, name)
        assert {p.session for p in await tmux.list_panes(host)} == {"base"}

    asyncio.run(check())


def test_a_target_is_any_name_a_session_can_have():
    for name in ["a\\$b", "#(touch X)", "x;rm -rf y", "名前", " spaced ", "-dash"]:
        assert tmux.is_session_name(name)
    for name in ["", "a:b", "a.b"]:  # tmux never stores ':' or '.': these would select a window or pane
        assert not tmux.is_session_name(name)
    with pytest.raises(ValueError):
        tmux.check_session_name("a$b")  # what trackside names its own sessions stays plain


# --- 4. a dashboard is not a run ---------------------------------------------------------


async def test_a_dashboards_pane_is_never_recorded_nor_read_as_a_run(host, tmux_dir, tmp_path, runs_root):
    config = config_file(tmp_path, runs_root)
    # A run for the dashboard to draw: its table shows the step and loss this prints.
    lines = "".join(f"iter {i}: loss {3 - i / 1000:.4f}, time 12.3ms, mfu 3.21%\n" for i in range(0, 500, 10))
    (tmp_path / "nanogpt.txt").write_text(lines)
    new_session("nanogpt", "sh", "-c", 'cat "$1"; sleep 600', "sh", str(tmp_path / "nanogpt.txt"))
    # The dashboard, then the pane's shell when it has quit: a dashboard ran there.
    script = f"cd {shlex.quote(str(REPO))} && {shlex.quote(TRACKSIDE)} --config {shlex.quote(config)}; exec sleep 600"
    subprocess.run(["tmux", "new-session", "-d", "-s", "dash", "-x", "160", "-y", "48", "sh", "-c", script], check=True)
    drawn = lambda: "nanogpt" in tmux_out("capture-pane", "-p", "-t", "=dash:")  # noqa: E731
    await eventually(drawn, timeout=120)

    def listed() -> dict:
        done = subprocess.run([TRACKSIDE, "runs", "--json", "--config", config], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return {r["session"]: r for r in json.loads(done.stdout)}

    def unread(run: dict) -> None:
        assert (run["last_step"], run["last_loss"], run["recorded_since"], run["pane"], run["progress"]) == (None,) * 5, run
        assert tmux_out("display-message", "-p", "-t", "=dash:", "#{pane_pipe}").strip() == "0"
        assert not list(Path(runs_root).glob("panes/*/dash-*"))

    now = listed()
    assert now["nanogpt"]["last_step"] == 490  # the other session is read
    unread(now["dash"])
    subprocess.run(["tmux", "send-keys", "-t", "=dash:", "q"], check=True)
    await eventually(lambda: tmux_out("display-message", "-p", "-t", "=dash:", "#{pane_current_command}").strip() == "sleep", timeout=60)
    unread(listed()["dash"])
