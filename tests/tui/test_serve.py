"""`trackside serve`: the real command in a subprocess on 127.0.0.1, a real headless
Chromium (Debian's package, installed by scripts/test.sh) on its page, and the
websocket's edge cases from a plain client.

Each served page runs its own dashboard process (a second or two of CPU to start), so
the browser test is one page for all its checks."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from scripts.browser import Browser, find_chromium, terminal_text
from scripts.local_box import end_tmux_server
from training import handover
from tui.commands import serve
from tui.app import TracksideApp, Watched
from tui.keys import READ_ONLY_HIDDEN
from tui.serve.server import ENDED, FULL

REPO = Path(__file__).resolve().parents[2]
TOKEN = "test-token-9f3a"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    """`trackside serve` in a subprocess, over a local host whose tmux server is the
    test's own (TMUX_TMPDIR), with one session `webrun` printing steps and losses."""

    def __init__(self, tmp: Path, *args: str, port: int | None = None) -> None:
        self.tmp, self.args = tmp, args
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("TMUX")}
        self.env["TMUX_TMPDIR"] = str(tmp / "tmux")
        (tmp / "tmux").mkdir(exist_ok=True)
        self.config = tmp / "config.toml"
        self.config.write_text(f'[defaults]\nruns_root = "{tmp / "runs"}"\npoll_ms = 1000\n')
        self.proc: subprocess.Popen | None = None
        self.output = tmp / f"serve-{self.port}.log"

    def tmux(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["tmux", *args], env=self.env, capture_output=True, text=True)

    def start_run(self) -> None:
        loop = 'i=0; while true; do i=$((i+1)); echo "step=$i loss=$((100 - i % 50))"; sleep 1; done'
        assert self.tmux("new-session", "-d", "-s", "webrun", "-x", "120", "-y", "30", loop).returncode == 0

    def start(self) -> None:
        self.skip = len(self.log())  # a restart appends to the same log
        argv = [sys.executable, "-m", "tui.cli", "serve", "--port", str(self.port), "--config", str(self.config), *self.args]
        with open(self.output, "ab") as out:
            self.proc = subprocess.Popen(argv, cwd=REPO, env=self.env, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while "the dashboard on" not in self.log()[self.skip :]:
            assert self.proc.poll() is None, f"trackside serve exited {self.proc.returncode}:\n{self.log()}"
            assert time.monotonic() < deadline, f"trackside serve did not start:\n{self.log()}"
            time.sleep(0.1)

    def log(self) -> str:
        return self.output.read_text() if self.output.exists() else ""

    @property
    def token(self) -> str:
        """What every request must present: the --token given, else the one it printed."""
        if "--token" in self.args:
            return self.args[self.args.index("--token") + 1]
        return re.findall(r"token \(shown only now\): (\S+)", self.log())[-1]

    @property
    def cookies(self) -> dict[str, str]:
        return {f"trackside_token_{self.port}": self.token}

    @property
    def cookie(self) -> dict[str, str]:
        """The token's cookie as a header (a client's jar keeps none for some addresses)."""
        return {"Cookie": f"trackside_token_{self.port}={self.token}"}

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def dashboards(self) -> list[int]:
        """The dashboard processes the server runs now (its children)."""
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        return [int(pid) for pid in children.read_text().split()] if children.exists() else []

    def close(self) -> None:
        self.stop()
        end_tmux_server("tmux", "-S", str(self.tmp / "tmux" / f"tmux-{os.getuid()}" / "default"))


@pytest.fixture
def served(tmp_path):
    made: list[Served] = []

    def make(*args: str, port: int | None = None, run: bool = True) -> Served:
        server = Served(tmp_path, *args, port=port)
        made.append(server)
        if run and len(made) == 1:
            server.start_run()
        server.start()
        return server

    yield make
    for server in made:
        server.close()


async def get_status(url: str, **kwargs) -> int:
    async with aiohttp.ClientSession() as session:
        async with session.get(url, allow_redirects=False, **kwargs) as answer:
            return answer.status


async def screen_of(url: str, *, seconds: float = 4.0, keys: str = "", cookies=None) -> tuple[str, int | None]:
    """What a plain websocket viewer is sent in `seconds` from its first frame, then after
    each of `keys`."""
    got = []
    async with aiohttp.ClientSession(cookies=cookies) as session:
        async with session.ws_connect(f"{url.replace('http', 'ws')}/ws?width=160&height=40") as ws:
            async def receive(until) -> None:
                while until() and not ws.closed:
                    with contextlib.suppress(TimeoutError):
                        message = await asyncio.wait_for(ws.receive(), 0.2)
                        if message.type == aiohttp.WSMsgType.BINARY:
                            got.append(message.data)

            for key in [None, *keys]:
                if key is not None:
                    await ws.send_json(["stdin", key])
                else:
                    # The dashboard's process starts per viewer: its first `seconds` count
                    # from its first frame (a slow machine took more than 3 s to send one).
                    first_frame_by = time.monotonic() + 60
                    await receive(lambda: not got and time.monotonic() < first_frame_by)
                deadline = time.monotonic() + seconds
                await receive(lambda: time.monotonic() < deadline)
            code = ws.close_code
    return terminal_text(got), code


async def alive(url: str, cookies=None) -> dict:
    async with aiohttp.ClientSession(cookies=cookies) as session:
        async with session.get(f"{url}/alive") as answer:
            return await answer.json()


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_the_dashboard_in_a_browser(served):
    if find_chromium() is None:
        pytest.skip("chromium is not installed: scripts/test.sh installs it when run as root (apt-get install chromium)")
    server = served("--token", TOKEN, "--max-viewers", "2")

    # Without the token: the page, its websocket, its script and /alive are refused.
    for path in ("/", "/ws", "/static/js/textual.js", "/alive", "/?token=wrong"):
        assert await get_status(server.url + path) == 403, path
    # A page of another origin may not drive the dashboard, token or not.
    origin = {"Origin": "http://evil.example:8080"}
    assert await get_status(server.url + f"/alive?token={TOKEN}", headers=origin) == 403

    async with Browser() as browser:
        await browser.open(f"{server.url}/?token={TOKEN}")
        # The token went into a cookie and out of the address bar.
        await browser.wait_js("location.search === '' && document.readyState === 'complete'", what="the redirect")
        await browser.wait_js("document.body.classList.contains('-first-byte')", what="the terminal's first draw")
        await browser.wait_text("webrun", timeout=30)
        fleet = await browser.screenshot()
        assert fleet.startswith(b"\x89PNG") and len(fleet) > 10_000

        async def keys_then(keys: list[str], shown: str) -> bytes:
            start = len(browser.frames)
            for key in keys:
                await browser.press(key)
            await browser.wait_text(shown, start)
            await asyncio.sleep(0.3)  # the frame's last bytes reach the canvas
            return await browser.screenshot()

        run_screen = await keys_then(["down", "enter"], "Log/lin y")  # the run screen's own keys
        back = await keys_then(["escape"], "fleet")
        asking = await keys_then(["k"], "Stop run local/webrun")
        answered = await keys_then(["n"], "Kill")  # the footer again, its k key
        assert len({fleet, run_screen, asking}) == 3 and answered != asking and back != run_screen
        assert server.tmux("has-session", "-t", "webrun").returncode == 0, "n killed the run"

        # A viewer whose connection dies without a word (a reset): the server ends its
        # dashboard and goes on serving.
        assert len(server.dashboards()) == 1
        with socket.create_connection(("127.0.0.1", server.port)) as raw:
            raw.sendall(
                f"GET /ws?width=80&height=24 HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
                f"Cookie: trackside_token_{server.port}={TOKEN}\r\n\r\n".encode()
            )
            assert raw.recv(4096).startswith(b"HTTP/1.1 101"), "the websocket was not accepted"
            deadline = time.monotonic() + 20
            while len(server.dashboards()) < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            raw.recv(4096)  # it is drawing
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        deadline = time.monotonic() + 20
        while len(server.dashboards()) > 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert len(server.dashboards()) == 1, "the vanished viewer's dashboard was left running"
        cookies = {f"trackside_token_{server.port}": TOKEN}
        while (await alive(server.url, cookies))["viewers"] > 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        await keys_then(["question_mark"], "Every action by name")  # the page still answers
        await keys_then(["escape"], "fleet")

        # The cap: this page and one more; a third is told why, with its own close code.
        async with aiohttp.ClientSession(cookies=cookies) as session:
            async with session.ws_connect(f"{server.url.replace('http', 'ws')}/ws") as second:
                await second.receive()
                _, code = await screen_of(server.url, seconds=1, cookies=cookies)
                assert code == FULL

        # The server goes away and comes back: the page says so, then reconnects itself.
        server.stop()
        await browser.wait_js("document.getElementById('status').textContent.includes('Connection lost')", what="the lost notice")
        await browser.wait_js("window.tracksideClosed && window.tracksideClosed.code !== 1000", what="the close")
        server.start()
        await browser.wait_js(
            "!window.tracksideClosed && document.body.classList.contains('-first-byte')", timeout=40, what="the reconnect"
        )
        assert "viewer 1 from" in server.log() and "refused a viewer" in server.log()

        # A server killed outright takes its dashboards with it (they would poll on
        # unwatched); the page is still open, so its dashboard is.
        dashboards = server.dashboards()
        assert len(dashboards) == 1, server.log()
        server.proc.kill()
        server.proc.wait()
        deadline = time.monotonic() + 15
        while any(map(handover.alive, dashboards)) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert not any(map(handover.alive, dashboards)), "a dashboard outlived its server"


@pytest.mark.timeout(120)
async def test_read_only_serves_no_kill_edit_or_relaunch(served):
    server = served("--read-only")
    text, _ = await screen_of(server.url, keys="k", seconds=3, cookies=server.cookies)
    assert "read-only: no kill, edit, relaunch, attach" in text
    assert "trackside (read-only)" in text
    for key in ("k Kill", "e Edit", "r Relaunch"):
        assert key not in text
    assert "Stop run" not in text  # k did nothing
    # On loopback, a page under another name (DNS rebinding) is refused, token or not.
    assert await get_status(server.url + "/", headers={"Host": f"rebound.example:{server.port}", **server.cookie}) == 403
    assert await get_status(server.url + "/", headers=server.cookie) == 200


@pytest.mark.timeout(120)
async def test_a_page_is_told_why_its_socket_closed(served):
    server = served(run=False)
    _, code = await screen_of(server.url, keys="q", seconds=3, cookies=server.cookies)
    assert code == 1000  # the dashboard quit on its key: the page offers to open another
    async with aiohttp.ClientSession(cookies=server.cookies) as session:
        async with session.ws_connect(f"{server.url.replace('http', 'ws')}/ws") as ws:
            await ws.receive()
            [dashboard] = server.dashboards()
            os.kill(dashboard, signal.SIGKILL)
            while (message := await asyncio.wait_for(ws.receive(), 20)).type == aiohttp.WSMsgType.BINARY:
                pass
            assert ws.close_code == ENDED, message
    deadline = time.monotonic() + 10
    while (await alive(server.url, server.cookies))["viewers"] and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert (await alive(server.url, server.cookies))["viewers"] == 0


async def test_read_only_app_refuses_the_actions_however_asked(tmp_path):
    app = TracksideApp([Watched(serve_host(tmp_path))], monitor=False, read_only=True)
    async with app.run_test() as pilot:
        await pilot.pause()
        for action in READ_ONLY_HIDDEN:
            assert app.check_action(action, ()) is False
            assert await app.run_action(action) is False
        assert not any(c.title.startswith("Kill") for c in app.get_system_commands(app.screen))


def serve_host(tmp_path):
    from backends.hosts import LocalHost

    return LocalHost("local", runs_root=str(tmp_path / "runs"))


async def test_a_loopback_address_of_its_own_is_served_as_itself(served):
    """--host 127.0.0.2 is loopback too: its own address is the one it answers to (every
    request was refused, told to open 127.0.0.1, where nothing listened)."""
    server = served("--host", "127.0.0.2", run=False)
    server.url = f"http://127.0.0.2:{server.port}"
    assert await get_status(server.url + "/", headers=server.cookie) == 200
    assert await get_status(server.url + "/", headers={"Host": f"evil.example:{server.port}", **server.cookie}) == 403


async def test_on_every_address_it_prints_urls_that_open_never_0_0_0_0(served):
    """--host 0.0.0.0 printed http://0.0.0.0:8765/, which opens nothing from another
    machine: it prints this machine's own addresses (as `hostname -I` lists them, a source
    apart from the one it reads) and its name, with the token; the server, listening on the
    wildcard, serves the page (asked on loopback: the tests send nothing to any other
    address)."""
    server = served("--host", "0.0.0.0", run=False)
    printed = re.findall(r"open (http://\S+)", server.log())
    assert printed and not any("0.0.0.0" in url for url in server.log().split())
    assert all(url.endswith(f"?token={server.token}") for url in printed)
    hosts = {re.match(r"http://([\d.]+):", url)[1] for url in printed if re.match(r"http://[\d.]+:", url)}
    own = {a for a in subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split()
           if "." in a}
    assert hosts and hosts == own, f"printed {hosts}, this machine's IPv4 addresses {own}:\n{server.log()}"
    port = re.search(r"http://[\d.]+:(\d+)/", printed[0])[1]
    assert await get_status(f"http://127.0.0.1:{port}/", headers=server.cookie) == 200


def test_a_token_is_made_and_printed_once_on_loopback_too(monkeypatch, capsys):
    from tui.serve import server

    seen = {}

    def fake_serve(settings, started):
        seen["settings"] = settings
        started()
        return 0

    monkeypatch.setattr(server, "serve", fake_serve)
    for host, loopback in (("192.0.2.1", False), ("127.0.0.1", True)):
        assert serve.main(["--host", host, "--port", "9999"]) == 0
        token = seen["settings"].token
        assert token and len(token) >= 24 and seen["settings"].loopback is loopback
        out = capsys.readouterr().out
        assert out.count(token) == 2 and "shown only now" in out  # the token, and the URL with it
    monkeypatch.setenv(serve.TOKEN_ENV, "from-env")
    assert serve.main(["--host", "192.0.2.1"]) == 0 and seen["settings"].token == "from-env"
    assert "from-env" not in capsys.readouterr().out


def test_a_port_in_use_and_a_missing_textual_serve_are_one_line(monkeypatch, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        assert serve.main(["--port", str(taken.getsockname()[1])]) == 1
    err = capsys.readouterr().err
    assert "cannot listen on 127.0.0.1" in err and "--port" in err and "Traceback" not in err
    monkeypatch.setitem(sys.modules, "tui.serve.server", None)  # as if textual-serve were absent
    monkeypatch.delattr(sys.modules["tui.serve"], "server", raising=False)
    assert serve.main([]) == 1
    assert "pip install 'trackside[serve]'" in capsys.readouterr().err


def test_a_host_that_does_not_resolve_is_not_a_port_to_change(capsys, tmp_path):
    """A name that resolves nowhere (.invalid never does) is said so; --port is offered
    only when the port is what failed."""
    config = tmp_path / "config.toml"
    config.write_text("[hosts.here]\n")
    assert serve.main(["--host", "nosuch.invalid", "--port", str(free_port()), "--config", str(config)]) == 1
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("trackside serve: cannot listen on nosuch.invalid: ")
    assert "does not resolve" in err and "--port" not in err
