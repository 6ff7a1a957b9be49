"""follow(): tail -F from a byte offset, locally and over SSH, through dropped connections."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from pathlib import Path

import pytest

from backends.hosts import LocalHost
from backends.logs.streams import Line, follow
from tests.waiting import wait_until


class Follower:
    """Runs follow() in a task, collecting its lines."""

    def __init__(self, host, path, offset=0, **kwargs):
        self.lines: list[Line] = []
        self._stream = follow(host, str(path), offset, **kwargs)
        self._task = asyncio.create_task(self._collect())

    async def _collect(self):
        async for line in self._stream:
            self.lines.append(line)

    @property
    def texts(self) -> list[str]:
        return [line.text for line in self.lines]

    async def wait_for(self, count: int, timeout: float = 10.0):
        await wait_until(lambda: len(self.lines) >= count, timeout, f"{count} lines (have {self.texts})")

    async def close(self):
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        await self._stream.aclose()


def offsets(content: bytes) -> list[int]:
    return [i + 1 for i, byte in enumerate(content) if byte == ord("\n")]


async def test_lines_carry_the_byte_offset_after_them(tmp_path):
    path = tmp_path / "log"
    path.write_bytes("one\nünï ✓\n\nfour\n".encode())
    follower = Follower(LocalHost(), path)
    try:
        await follower.wait_for(4)
    finally:
        await follower.close()
    assert follower.texts == ["one", "ünï ✓", "", "four"]
    assert [line.end_offset for line in follower.lines] == offsets(path.read_bytes())


async def test_resumes_from_an_offset_and_follows_appends(tmp_path):
    path = tmp_path / "log"
    path.write_text("old\nolder\nnew\n")
    follower = Follower(LocalHost(), path, offset=len("old\nolder\n"))
    try:
        await follower.wait_for(1)
        with path.open("a") as f:
            f.write("appended\n")
        await follower.wait_for(2)
    finally:
        await follower.close()
    assert follower.lines == [Line("new", 14), Line("appended", 23)]


async def test_partial_last_line_is_held_until_its_newline(tmp_path):
    path = tmp_path / "log"
    path.write_text("done\nhalf")
    follower = Follower(LocalHost(), path)
    try:
        await follower.wait_for(1)
        await asyncio.sleep(0.3)
        assert follower.texts == ["done"]
        with path.open("a") as f:
            f.write(" and the rest\n")
        await follower.wait_for(2)
    finally:
        await follower.close()
    assert follower.lines == [Line("done", 5), Line("half and the rest", 23)]


async def test_waits_for_a_file_that_does_not_exist_yet(tmp_path):
    path = tmp_path / "later" / "metrics.jsonl"
    follower = Follower(LocalHost(), path)
    try:
        await asyncio.sleep(0.3)
        path.parent.mkdir()
        path.write_text('{"event": "start"}\n')
        await follower.wait_for(1, timeout=15)
    finally:
        await follower.close()
    assert follower.lines == [Line('{"event": "start"}', 19)]


async def test_truncation_restarts_at_byte_zero(tmp_path):
    path = tmp_path / "log"
    path.write_text("first run, line 1\nfirst run, line 2\n")
    follower = Follower(LocalHost(), path)
    try:
        await follower.wait_for(2)
        path.write_text("")
        await asyncio.sleep(0.5)
        with path.open("a") as f:
            f.write("second\n")
        await follower.wait_for(3, timeout=15)
    finally:
        await follower.close()
    assert follower.lines[2:] == [Line("second", 7)]


async def test_an_offset_past_the_end_means_the_file_was_replaced(tmp_path):
    path = tmp_path / "log"
    path.write_text("short\n")
    follower = Follower(LocalHost(), path, offset=1000)
    try:
        await follower.wait_for(1)
    finally:
        await follower.close()
    assert follower.lines == [Line("short", 6)]


def tails_of(path: Path) -> list[int]:
    """PIDs of tail processes following `path`, wherever they were started."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            argv = cmdline.read_bytes().split(b"\0")
            if argv[0].endswith(b"tail") and str(path).encode() in argv:
                found.append(int(cmdline.parent.name))
    return found


async def test_follow_over_ssh_and_closing_ends_the_remote_tail(ssh_host, tmp_path):
    path = tmp_path / "console.log"
    path.write_text("a\nb\n")
    follower = Follower(ssh_host, path)
    try:
        await follower.wait_for(2)
        assert tails_of(path)
    finally:
        await follower.close()
    assert follower.lines == [Line("a", 2), Line("b", 4)]
    await wait_until(lambda: not tails_of(path), 10, "the remote tail to end")


# A trainer stand-in: numbered JSON lines of varying byte lengths, some written in two
# halves, until told to stop; then an END line.
WRITER = r"""
import json, os, sys, time
path, stop = sys.argv[1], sys.argv[2]
with open(path, "a", encoding="utf-8") as f:
    i = 0
    while not os.path.exists(stop):
        line = json.dumps({"event": "step", "step": i, "note": "é✓" * (i % 5)}, ensure_ascii=False) + "\n"
        if i % 7 == 0:
            f.write(line[:9]); f.flush(); time.sleep(0.01); f.write(line[9:])
        else:
            f.write(line)
        f.flush()
        i += 1
        time.sleep(0.003)
    f.write("END\n")
"""

DROPS = 6  # per kind: 12 forced drops over the two kinds


@pytest.mark.parametrize("kind", ["sshd-restart", "connection-severed"])
async def test_follow_resumes_after_drops_with_no_line_lost_or_repeated(fresh_sshd, tmp_path, kind):
    server = fresh_sshd
    host = server.host(backoff_cap=0.5)
    path, stop = tmp_path / "metrics.jsonl", tmp_path / "stop"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(stop)])
    follower = Follower(host, path, retry_cap_s=0.5)
    try:
        for _ in range(DROPS):
            await follower.wait_for(len(follower.lines) + 20, timeout=20)
            connects = host.connects
            if kind == "sshd-restart":
                server.stop()
                await asyncio.sleep(0.3)
                server.start()
            else:
                assert server.sever() > 0
            await wait_until(lambda: host.connects > connects, 20, "a reconnect")
        await follower.wait_for(len(follower.lines) + 20, timeout=20)
        stop.touch()
        assert writer.wait(10) == 0
        await wait_until(lambda: follower.texts[-1:] == ["END"], 20, "the END line")
    finally:
        writer.kill()
        await follower.close()
        await host.close()
    assert host.connects == DROPS + 1
    content = path.read_bytes()
    assert "".join(text + "\n" for text in follower.texts).encode() == content
    assert [line.end_offset for line in follower.lines] == offsets(content)
