"""Following a growing file on a host (`tail -F` semantics) from a byte offset.

`follow(host, path, offset)` yields each complete line with the byte offset just after
it. When the host drops, it waits (backends.retry.Backoff) and resumes from the last offset it
yielded, so the lines received equal the file: none lost, none twice. A file that does not
exist yet is waited for; when the file is truncated or replaced, following restarts at
its byte 0, as `tail -F` does.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass

from backends.hosts import Host, HostError
from backends.retry import Backoff

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
                pending = b""
                async for chunk in chunks:
                    *complete, pending = (pending + chunk).split(b"\n")
                    for raw in complete:
                        if not started:
                            offset, started = int(raw), True
                            continue
                        if _RESTART.search(raw):
                            offset = 0
                            continue
                        if _NOTICE.match(raw):
                            continue
                        offset += len(raw) + 1
                        yield Line(raw.decode(errors="replace"), offset)
                        backoff.succeeded()
        except HostError:
            pass
        # Only a lost host or a killed tail gets here: wait, then resume from `offset`.
        await asyncio.sleep(backoff.failed())
