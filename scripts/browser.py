"""Headless Chromium (Debian's `chromium`), driven over the Chrome DevTools protocol.

For `trackside serve`'s screenshot (scripts/serve_screenshot.py) and its tests: open a
page, wait on JavaScript conditions, press keys, read what the page's websocket received,
take screenshots. The browser resolves no name but 127.0.0.1 and makes no background
requests, so it talks to the test's server only.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import aiohttp

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")

# What Input.dispatchKeyEvent needs for each key the tests press.
KEYS = {
    "enter": dict(key="Enter", code="Enter", windowsVirtualKeyCode=13, text="\r"),
    "escape": dict(key="Escape", code="Escape", windowsVirtualKeyCode=27),
    "down": dict(key="ArrowDown", code="ArrowDown", windowsVirtualKeyCode=40),
    "question_mark": dict(key="?", code="Slash", windowsVirtualKeyCode=191, text="?", modifiers=8),
}


def terminal_text(frames: list[bytes]) -> str:
    """What a terminal was sent, its escapes (styles, cursor moves) removed: the words
    drawn, each run of them whole."""
    raw = b"".join(frames).decode("utf-8", "replace")
    return re.sub(r"\x1b\[[0-9;?<>=]*[ -/]*[@-~]|\x1b[@-_][^\x1b]*?(\x07|\x1b\\)?", "", raw)


def find_chromium() -> str | None:
    return next((path for name in CHROMIUM_NAMES if (path := shutil.which(name))), None)


def _key(name: str) -> dict:
    if name in KEYS:
        return KEYS[name]
    assert len(name) == 1 and name.isalpha(), name
    return dict(key=name, code=f"Key{name.upper()}", windowsVirtualKeyCode=ord(name.upper()), text=name)


class Browser:
    """One headless Chromium with one page. `async with Browser() as b: await b.open(url)`."""

    def __init__(self, width: int = 1400, height: int = 860) -> None:
        self.width, self.height = width, height
        self.proc: subprocess.Popen | None = None
        self.profile = tempfile.mkdtemp(prefix="trackside-chromium-")
        self.ids = itertools.count(1)
        self.pending: dict[int, asyncio.Future] = {}
        self.frames: list[bytes] = []  # what the page's websockets received, in order
        self.closed_sockets = 0
        self.session: aiohttp.ClientSession | None = None
        self.ws = None
        self.reader: asyncio.Task | None = None

    async def __aenter__(self) -> Browser:
        chromium = find_chromium()
        if chromium is None:
            raise RuntimeError("chromium is not installed (apt-get install chromium)")
        self.proc = subprocess.Popen(
            [
                chromium, "--headless", "--no-sandbox", "--disable-gpu", "--enable-unsafe-swiftshader",
                f"--user-data-dir={self.profile}", "--remote-debugging-port=0", "--remote-debugging-address=127.0.0.1",
                f"--window-size={self.width},{self.height}", "--hide-scrollbars", "--force-device-scale-factor=1",
                # Nothing but the test's server: no name resolves, no background requests.
                "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--disable-extensions", "--disable-default-apps",
                "--no-first-run", "--no-default-browser-check", "--no-pings", "--disable-domain-reliability",
                "--disable-features=Translate,OptimizationHints,MediaRouter,AutofillServerCommunication",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        port_file = Path(self.profile) / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not port_file.is_file() or not port_file.read_text().strip():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"chromium did not start (exit {self.proc.poll()})")
            await asyncio.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        self.session = aiohttp.ClientSession()
        async with self.session.get(f"http://127.0.0.1:{port}/json/list") as answer:
            pages = [t for t in await answer.json() if t["type"] == "page"]
        self.ws = await self.session.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=0)
        self.reader = asyncio.create_task(self._read())
        await self.send("Network.enable")
        await self.send("Page.enable")
        return self

    async def __aexit__(self, *exc) -> None:
        if self.reader:
            self.reader.cancel()
        if self.ws:
            await self.ws.close()
        if self.session:
            await self.session.close()
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)

    async def _read(self) -> None:
        async for message in self.ws:
            data = json.loads(message.data)
            if "id" in data:
                future = self.pending.pop(data["id"], None)
                if future and not future.done():
                    future.set_result(data)
            elif data.get("method") == "Network.webSocketFrameReceived":
                response = data["params"]["response"]
                payload = response["payloadData"]
                self.frames.append(base64.b64decode(payload) if response["opcode"] == 2 else payload.encode())
            elif data.get("method") == "Network.webSocketClosed":
                self.closed_sockets += 1

    async def send(self, method: str, **params) -> dict:
        id_ = next(self.ids)
        future = self.pending[id_] = asyncio.get_running_loop().create_future()
        await self.ws.send_json({"id": id_, "method": method, "params": params})
        async with asyncio.timeout(30):
            answer = await future
        if "error" in answer:
            raise RuntimeError(f"{method}: {answer['error']}")
        return answer.get("result", {})

    async def open(self, url: str) -> None:
        await self.send("Page.navigate", url=url)

    async def evaluate(self, expression: str):
        result = await self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        return result.get("result", {}).get("value")

    async def wait_js(self, expression: str, timeout: float = 30, what: str = "") -> object:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if value := await self.evaluate(expression):
                return value
            await asyncio.sleep(0.1)
        raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what or expression}")

    def text(self, start: int = 0) -> str:
        """What the page's websocket received from frame `start` on, escapes removed."""
        return terminal_text(self.frames[start:])

    async def wait_text(self, needle: str, start: int = 0, timeout: float = 30) -> None:
        """Until the page has been sent `needle` (in frames from `start` on)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if needle in self.text(start):
                return
            await asyncio.sleep(0.1)
        # Its lines with something on them: a frame's tail is often blank rows (CI once showed nothing else).
        sent = "\n".join(line.strip() for line in self.text(start).splitlines() if line.strip())
        raise AssertionError(f"the page was never sent {needle!r} in {timeout:.0f}s; what it was sent: {sent[-2000:]!r}")

    async def press(self, name: str) -> None:
        key = _key(name)
        # Keys go to the focused element: xterm's input box, as after a click on the terminal.
        await self.evaluate("document.querySelector('.xterm-helper-textarea')?.focus()")
        await self.send("Input.dispatchKeyEvent", type="keyDown", **key)
        up = {k: v for k, v in key.items() if k != "text"}
        await self.send("Input.dispatchKeyEvent", type="keyUp", **up)

    async def screenshot(self, path: Path | None = None) -> bytes:
        png = base64.b64decode((await self.send("Page.captureScreenshot", format="png"))["data"])
        if path is not None:
            path.write_bytes(png)
        return png
