"""`trackside serve` on loopback, tried as another user of the machine would: a plain HTTP
client and a plain websocket with no token or a wrong one. Once, such a websocket drove
root's dashboard and killed a session (k, then y). Now every path into the server asks
for the token, on loopback too; it is made and printed when not given, and `--no-token`
is an explicit, warned choice. The real command in a subprocess on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from scripts.browser import terminal_text
from tests.tui.test_serve import get_status, screen_of, served  # noqa: F401 (fixture)
from tui.commands import serve
from tui.serve.server import COOKIE

PATHS = ["/", "/?width=80", "/ws", "/ws?width=80&height=24", "/alive", "/static/js/textual.js", "/static/", "/no-such-page"]


async def drive(url: str, headers: dict, killed) -> int | None:
    """The attack: a plain websocket that opens the kill dialog on the fleet's first run and
    answers yes, then stays until `killed()` (or a minute); the status its handshake was
    refused with (None: it was let in)."""
    async with aiohttp.ClientSession() as session:
        try:
            ws = await session.ws_connect(f"{url.replace('http', 'ws')}/ws?width=160&height=40", headers=headers)
        except aiohttp.WSServerHandshakeError as refused:
            return refused.status
        async with ws:
            frames: list[bytes] = []

            async def until(done) -> None:
                deadline = time.monotonic() + 60
                while not done() and time.monotonic() < deadline:
                    message = await asyncio.wait_for(ws.receive(), 60)
                    if message.type != aiohttp.WSMsgType.BINARY:
                        return
                    frames.append(message.data)

            await until(lambda: "webrun" in terminal_text(frames))
            await ws.send_json(["stdin", "k"])
            await until(lambda: "Stop run" in terminal_text(frames))
            await ws.send_json(["stdin", "y"])
            await until(killed)
    return None


@pytest.mark.timeout(240)
async def test_without_its_token_a_local_client_gets_nothing_and_stops_nothing(served):
    server = served()  # no --token: one is made, and printed once
    token = server.token
    assert len(token) >= 24 and f"?token={token}" in server.log()
    wrong = token[:-1] + ("a" if token[-1] != "a" else "b")
    cookie = COOKIE.format(port=server.port)
    for path in PATHS:
        for headers, query in (({}, ""), ({}, "token=" + wrong), ({}, "token="), ({"Cookie": f"{cookie}={wrong}"}, ""),
                               ({"Cookie": f"trackside_token_1={token}"}, "")):  # another server's cookie  # fmt: skip
            url = server.url + path + (("&" if "?" in path else "?") + query if query else "")
            assert await get_status(url, headers=headers) == 403, (path, headers, query)
    def killed() -> bool:
        return server.tmux("has-session", "-t", "webrun").returncode != 0

    for headers in ({}, {"Cookie": f"{cookie}={wrong}"}):
        assert await drive(server.url, headers, killed) == 403
    assert server.dashboards() == [] and "viewer 1 from" not in server.log()  # no dashboard was even started
    assert server.tmux("has-session", "-t", "webrun").returncode == 0, "a client without the token killed the run"

    # With the printed token, as a cookie or in the URL, it is the dashboard.
    assert await get_status(f"{server.url}/alive?token={token}") == 200
    assert await get_status(f"{server.url}/", headers=server.cookie) == 200
    text, _ = await screen_of(server.url, seconds=2, cookies=server.cookies)
    assert "webrun" in text


@pytest.mark.timeout(120)
async def test_no_token_is_an_explicit_choice_and_warned(served):
    server = served("--no-token", run=False)
    assert "warning: --no-token: every user of this machine can drive this dashboard" in server.log()
    assert "token (shown only now)" not in server.log()
    assert await get_status(f"{server.url}/") == 200


def test_no_token_only_on_loopback_and_never_with_a_token(monkeypatch, capsys):
    from tui.serve import server

    monkeypatch.setattr(server, "serve", lambda settings, started: pytest.fail("served"))
    assert serve.main(["--no-token", "--host", "192.0.2.1"]) == 2
    assert serve.main(["--no-token", "--token", "t"]) == 2
    monkeypatch.setenv(serve.TOKEN_ENV, "from-env")
    assert serve.main(["--no-token"]) == 2
    said = capsys.readouterr().err.splitlines()
    assert len(said) == 3 and "only on loopback" in said[0] and all("choose one" in line for line in said[1:]), said
