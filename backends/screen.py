"""What a terminal shows of the bytes a pane printed: the text parsed is the text drawn.

A recorded line holds every redraw of a tqdm or Rich bar and every escape the program
wrote; only what a terminal would have left on screen is read, each redraw state in turn.
"""

from __future__ import annotations

import re

# Terminal escapes tqdm, Rich and colour loggers write: cursor moves, colours, and OSC 8
# hyperlinks (Rich's log handler links each record to its source file).
_ANSI = re.compile(r"\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-_]")


def visible_text(line: str) -> str:
    """What a terminal would leave on screen: the last carriage-return segment, no escapes.

    tqdm redraws a bar in place with \\r, so a captured pane line holds every redraw; the last
    one is the newest.
    """
    segments = [s for s in _ANSI.sub("", line).split("\r") if s.strip()]
    return segments[-1].rstrip("\n") if segments else ""


# Where a terminal starts drawing over what it drew: a carriage return, backspaces (Keras
# moves back over its whole bar), or a cursor moved up (Rich's live bars redraw their lines
# from the top).
_REDRAW = re.compile(r"\r|\x08+|\x1b\[[0-9]*[AF]")


def redraws(line: str) -> list[str]:
    """Every state a recorded line was drawn in, oldest first, as visible text: a tqdm or
    Rich bar redrawn in place a hundred times is a hundred states, each a step shown."""
    states = (_ANSI.sub("", part).rstrip() for part in _REDRAW.split(line))
    return [state for state in states if state.strip()]
