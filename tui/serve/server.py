"""The web server of `trackside serve`: the page, its websocket, and the guard on both.

Built on textual-serve's public parts: `AppService` runs one dashboard process per
websocket and relays its screen, and the page loads textual-serve's terminal script and
fonts from its package. textual-serve's own `Server` is not used: it cannot check a
token, cap viewers, or tell a page that its dashboard process ended, and its page asks
Google for a font (a browser here talks to this server only).
"""

from __future__ import annotations

import asyncio
import errno
import hmac
import json
import os
import signal
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import textual_serve
from aiohttp import WSMsgType, web
from textual_serve.app_service import AppService
from textual_serve.download_manager import DownloadManager

from tui.serve.page import page
from tui.textual_compat import app_service_process

COOKIE = "trackside_token_{port}"  # cookies ignore the port: one per server on a machine
FULL = 4001  # the websocket's close code over the viewer cap (4000–4999: the application's)
ENDED = 4002  # the dashboard process ended without being asked to
STOP_S = 10.0  # a dashboard asked to quit has this long before it is killed
HEARTBEAT_S = 15.0  # a browser gone without a word is noticed within two of these
LOOPBACK_NAMES = {"127.0.0.1", "localhost", "::1", "[::1]"}
STATIC = Path(textual_serve.__file__).parent / "static"


class ServeError(Exception):
    """Why the server cannot start, in one line."""


@dataclass
class Settings:
    command: str
    host: str
    port: int
    token: str | None  # None only by the operator's --no-token (on loopback)
    loopback: bool
    max_viewers: int
    read_only: bool = False


class Viewer(AppService):
    """One page's dashboard process. Unlike textual-serve's, it outlives its page's socket
    quietly: what the dashboard draws after the page has gone is dropped, so its output
    is read to the end and the process can quit (unread, it would block on a full pipe)."""

    quit_asked = False

    async def on_data(self, payload: bytes) -> None:
        try:
            await super().on_data(payload)
        except ConnectionError:
            pass  # the page went away: nothing to draw on

    async def on_meta(self, data: bytes) -> None:
        try:
            kind = json.loads(data).get("type")
        except (ValueError, AttributeError):
            return  # no packet of the dashboard's driver: textual-serve could not read it either
        if kind == "exit":
            self.quit_asked = True  # the dashboard quit on its own key (q)
        try:
            await super().on_meta(data)
        except ConnectionError:
            pass  # as above: the page went away

    async def run(self) -> None:
        await super().run()
        # The dashboard's output has ended: it quit, or it died. Say which to the page
        # (textual-serve's own socket would stay open on a dead process).
        await self.remote_close()


class Server:
    def __init__(self, settings: Settings, log: Callable[[str], None]) -> None:
        self.settings = settings
        self.log = log
        self.viewers: dict[web.WebSocketResponse, Viewer] = {}
        self.idle = asyncio.Event()
        self.idle.set()
        self.downloads = DownloadManager()  # required by AppService; the dashboard sends no files
        self.served = 0
        self.stopping = False
        self.cookie = COOKIE.format(port=settings.port)

    def make_app(self) -> web.Application:
        app = web.Application(middlewares=[self.guard])
        app.add_routes([
            web.get("/", self.index),
            web.get("/ws", self.websocket),
            web.get("/alive", self.alive),
            web.static("/static", STATIC),
        ])  # fmt: skip
        return app

    # --- who may ask ----------------------------------------------------------------

    @web.middleware
    async def guard(self, request: web.Request, handler):
        settings = self.settings
        # On loopback the browser's own machine is trusted, but not every page it opens:
        # a name other than the loopback one is a DNS-rebinding page, and a websocket from
        # another origin is a page driving this dashboard's keys.
        if settings.loopback and urlsplit(f"//{request.host}").hostname not in {*LOOPBACK_NAMES, settings.host}:
            # Named as it listens (127.0.0.2 is loopback too, and 127.0.0.1 may answer nothing).
            shown = f"[{settings.host}]" if ":" in settings.host else settings.host
            raise web.HTTPForbidden(text=f"trackside serve: open it as http://{shown}:{settings.port}/\n")
        origin = request.headers.get("Origin")
        if origin is not None and urlsplit(origin).netloc != request.host:
            raise web.HTTPForbidden(text="trackside serve: a page of another origin\n")
        if settings.token is None:
            return await handler(request)
        given = request.query.get("token")
        presented = given if given is not None else request.cookies.get(self.cookie, "")
        if not hmac.compare_digest(presented.encode(), settings.token.encode()):
            raise web.HTTPForbidden(text="trackside serve: this page needs its token: open the URL with ?token=…\n")
        if given is None or request.path != "/":
            return await handler(request)
        # The page's token moves to a cookie, and out of the address bar, history and Referer.
        rest = request.rel_url.with_query({k: v for k, v in request.query.items() if k != "token"})
        response = web.Response(status=303, headers={"Location": str(rest)})
        response.set_cookie(self.cookie, settings.token, httponly=True, samesite="Strict", path="/")
        return response

    # --- the page -------------------------------------------------------------------

    async def index(self, request: web.Request) -> web.Response:
        font_size = _bounded(request.query.get("fontsize"), 16, 6, 64)
        title = "trackside (read-only)" if self.settings.read_only else "trackside"
        return web.Response(text=page(title, font_size, FULL, ENDED), content_type="text/html")

    async def alive(self, request: web.Request) -> web.Response:
        """What a page that lost its socket polls before loading again (not while this
        server stops: a page loaded then would find no server)."""
        if self.stopping:
            raise web.HTTPServiceUnavailable(text="trackside serve is stopping\n")
        return web.json_response({"viewers": len(self.viewers), "max_viewers": self.settings.max_viewers})

    async def websocket(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(heartbeat=HEARTBEAT_S)
        await ws.prepare(request)
        if self.stopping:
            await ws.close(code=1001, message=b"trackside serve is stopping")
            return ws
        if len(self.viewers) >= self.settings.max_viewers:
            reason = f"{len(self.viewers)} pages are open already: the cap is {self.settings.max_viewers} (--max-viewers)"
            await ws.close(code=FULL, message=reason.encode()[:120])
            self.log(f"refused a viewer from {request.remote}: {reason}")
            return ws

        async def close_page() -> None:
            if viewer.quit_asked:
                await ws.close()
            else:
                await ws.close(code=ENDED, message=b"the dashboard process ended: see the server's output")

        viewer = Viewer(
            self.settings.command, write_bytes=ws.send_bytes, write_str=ws.send_str, close=close_page,
            download_manager=self.downloads,
        )  # fmt: skip
        self.viewers[ws] = viewer
        self.idle.clear()
        self.served += 1
        number = self.served
        self.log(f"viewer {number} from {request.remote} ({len(self.viewers)} of {self.settings.max_viewers} open)")
        try:
            await viewer.start(_bounded(request.query.get("width"), 80, 10, 1000),
                               _bounded(request.query.get("height"), 24, 5, 500))  # fmt: skip
            await self.relay(ws, viewer)
        except OSError as error:  # its process would not start, its page went: never the server's
            self.log(f"viewer {number}: {type(error).__name__}: {error}")
        finally:
            await self.stop_viewer(viewer)
            del self.viewers[ws]
            if not self.viewers:
                self.idle.set()
            self.log(f"viewer {number} left ({len(self.viewers)} open)")
        return ws

    async def relay(self, ws: web.WebSocketResponse, viewer: Viewer) -> None:
        """The page's keys, size and focus to the dashboard, until the page goes."""
        async for message in ws:
            if message.type != WSMsgType.TEXT:
                continue
            try:
                kind, *data = json.loads(message.data)
                if kind == "stdin":
                    await viewer.send_bytes(str(data[0]).encode("utf-8"))
                elif kind == "resize":
                    await viewer.set_terminal_size(_bounded(data[0]["width"], 80, 10, 1000),
                                                   _bounded(data[0]["height"], 24, 5, 500))  # fmt: skip
                elif kind == "ping":
                    await ws.send_json(["pong", data[0]])
                elif kind == "blur":
                    await viewer.blur()
                elif kind == "focus":
                    await viewer.focus()
            except (ValueError, TypeError, KeyError, IndexError):
                continue  # a garbled message from a page is dropped, not obeyed

    async def stop_viewer(self, viewer: Viewer) -> None:
        """Ask the dashboard to quit; kill it if it has not within STOP_S."""
        try:
            async with asyncio.timeout(STOP_S):
                await asyncio.shield(viewer.stop())
            return
        except (TimeoutError, OSError):  # slow to quit, or its stdin already gone with it
            pass
        # Without AppService's process, the process is left to end with its stdin (it
        # reads EOF when this server goes).
        process = app_service_process(viewer)
        if process is not None and process.returncode is None:
            self.log("a dashboard process did not quit: killed")
            process.kill()

    async def close_all(self) -> None:
        self.stopping = True
        for ws in list(self.viewers):
            await ws.close(code=1001, message=b"trackside serve stopped")
        try:
            async with asyncio.timeout(STOP_S + 2):
                await self.idle.wait()
        except TimeoutError:
            pass


def _bounded(value, default: int, low: int, high: int) -> int:
    try:
        return min(max(int(value), low), high)
    except (TypeError, ValueError):
        return default


def say(line: str, file=None) -> None:
    """A line of the server's log. Its terminal may be gone (the ssh session it ran in
    ended): the server still stops its dashboards, silently."""
    try:
        print(f"trackside serve: {line}", file=file or sys.stdout, flush=True)
    except OSError:
        pass


def serve(settings: Settings, started: Callable[[], None]) -> int:
    if not (STATIC / "js" / "textual.js").is_file():
        raise ServeError(f"textual-serve's page script is not at {STATIC}/js/textual.js: reinstall textual-serve")
    return asyncio.run(_serve(settings, started))


# What to do about a failed listen: another port only when the port is what failed (taken,
# or below 1024 for a user), never for an address.
LISTEN_HINTS = {
    errno.EADDRINUSE: "another port: --port",
    errno.EACCES: "another port: --port",
    errno.EADDRNOTAVAIL: "not an address of this machine: --host",
}


def listen_failure(settings: Settings, error: OSError) -> str:
    if isinstance(error, socket.gaierror):
        return f"cannot listen on {settings.host}: the name does not resolve ({error.strerror}); --host takes an address or a name of this machine"
    said = f"cannot listen on {settings.host}:{settings.port}: {os.strerror(error.errno) if error.errno else error}"
    hint = LISTEN_HINTS.get(error.errno)
    return f"{said} ({hint})" if hint else said


async def _serve(settings: Settings, started: Callable[[], None]) -> int:
    server = Server(settings, say)
    runner = web.AppRunner(server.make_app(), access_log=None, handle_signals=False)
    await runner.setup()
    try:
        await web.TCPSite(runner, settings.host, settings.port).start()
    except OSError as error:
        await runner.cleanup()
        raise ServeError(listen_failure(settings, error)) from None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # SIGHUP: the ssh session it ran in ended
        loop.add_signal_handler(signum, stop.set)
    started()
    await stop.wait()
    say("stopping; each open page's dashboard quits", file=sys.stderr)
    await server.close_all()
    await runner.cleanup()
    return 0
