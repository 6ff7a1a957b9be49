"""Following a growing file on a host (`tail -F` semantics) from a byte offset.

`follow(host, path, offset)` yields each complete line with the byte offset just after
it. When the host drops, it waits (backends.retry.Backoff) and resumes from the last offset it
yielded, so the lines received equal the file: none lost, none twice. A file that does not
exist yet is waited for; when the file is truncated or replaced, following restarts at
its byte 0, as `tail -F` does.

A line is held until its newline at most LINE_BYTES: the rest of a longer one (a pane
that prints without newlines) is counted in its offset, not kept, and the line ends in
`…`, so memory stays bounded and no number its cut shortened is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass

from backends.hosts import Host, HostError
from backends.retry import Backoff

LINE_BYTES = 64 << 10  # of one line, held until its newline: a tqdm bar's redraws, many of them
_NOTICE_BYTES = 4096  # the end of a longer one, kept to find tail's notice in

# Prints the offset it really starts from (0 if the file shrank while we were away), then
# the file from there on. tail's notices share stdout, in order, so a restart at byte 0
# can be told from data; LC_ALL=C makes them recognisable.
_FOLLOW_SCRIPT = """\
f=$1 o=$2
case $f in "~/"*) f=$HOME/${f#"~/"} ;; esac
s=$(wc -c 2>/dev/null <"$f") && [ "$s" -lt "$o" ] && o=0
echo "$o"
LC_ALL=C exec tail -c +$((o + 1)) -F -- "$f" 2>&1
"""

# GNU tail's notices under -F: those that mean "reading the file again from byte 0" (found
# anywhere in a line, as a partial last line of the old file may precede them), and the
# others, which start a line.
_RESTART = re.compile(
    rb"tail: .*(?: file truncated| has appeared;  following new file| has been replaced;  following new file)$"
)
_NOTICE = re.compile(
    rb"tail: (?:cannot open .* for reading: |.* has become inaccessible: |inotify |warning: "
    rb"|.* has been replaced with an untailable file|error reading |no files remaining$)"
)


class _Held:
    """The line read so far: its first LINE_BYTES, and of the rest its count and its last
    bytes (where tail's notice, written after a last line without its newline, would be)."""

    def __init__(self) -> None:
        self.head, self.last, self.cut = bytearray(), b"", 0

    def grow(self, part: bytes) -> None:
        room = LINE_BYTES - len(self.head)
        self.head += part[:room]
        if len(part) > room:
            self.cut += len(part) - room
            self.last = (self.last + part[room:])[-_NOTICE_BYTES:]

    def seen(self) -> bytes:
        """What is kept of it, to find a notice in."""
        return self.head + self.last if self.cut else self.head


@dataclass(frozen=True)
class Line:
    text: str
    end_offset: int  # byte offset just after this line's newline: where to resume


async def follow(
    host: Host, path: str, offset: int = 0, *, retry_s: float = 0.1, retry_cap_s: float = 5.0
) -> AsyncIterator[Line]:
    """Yield the complete lines of `path` on `host` from byte `offset`, forever.

    Host errors are not raised: following pauses and resumes when the host is back.
    A last line without its newline is held until the newline arrives.
    """
    backoff = Backoff(retry_s, retry_cap_s)
    while True:
        argv = ["sh", "-c", _FOLLOW_SCRIPT, "sh", path, str(offset)]
        try:
            async with contextlib.aclosing(host.chunks(argv)) as chunks:
                started = False
                line = _Held()
                async for chunk in chunks:
                    first, *others = chunk.split(b"\n")
                    line.grow(first)
                    for part in others:  # each ends the line before it
                        raw, seen, cut = line.head, line.seen(), line.cut
                        line = _Held()
                        line.grow(part)
                        if not started:
                            offset, started = int(raw), True
                            continue
                        if _RESTART.search(seen):
                            offset = 0
                            continue
                        if _NOTICE.match(seen):
                            continue
                        offset += len(raw) + cut + 1
                        text = raw.decode(errors="replace")
                        yield Line(text + "…" if cut else text, offset)
                        backoff.succeeded()
        except HostError:
            pass
        # Only a lost host or a killed tail gets here: wait, then resume from `offset`.
        await asyncio.sleep(backoff.failed())
