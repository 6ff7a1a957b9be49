"""What the dashboard draws, made inert: every widget's text passes here on its way to the
screen (a cell, the stats, a dialog, an alert, a notification).

Run names, session names, a manifest's params, a process's name, a pane's bar label and a
host's error are anyone's: a Rich `Text` keeps their escape sequences and control
characters, and a string given to Textual is read as markup. `inert` gives the same
content cleaned (backends.sanitize), line breaks kept, as Text that no widget parses.
"""

from __future__ import annotations

from rich.text import Text

from backends import sanitize


def _clean(plain: str) -> bool:
    return all(line.isprintable() and len(line) <= sanitize.LINE_CAP for line in plain.split("\n"))


def _lines(plain: str) -> str:
    return "\n".join(sanitize.line(line) for line in plain.split("\n"))


def inert(content: Text | str) -> Text:
    """`content` as a widget may draw it: text as it is when it holds no control (most
    does); else cleaned, each line at most sanitize.LINE_CAP characters, keeping its own
    style (a span of it styled apart loses that)."""
    if isinstance(content, Text):
        if _clean(content.plain.replace("\t", " ")):
            return content
        return Text(_lines(content.plain), style=content.style, justify=content.justify, no_wrap=content.no_wrap, end=content.end)
    return Text(_lines(content))
