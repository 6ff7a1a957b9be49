"""Text another program controls, made inert: what is drawn or printed holds no control.

A pane's bytes, a log line, a manifest's fields, a session's or process's name: any of
them may carry escape sequences that a terminal obeys (a clipboard write, a title, a
reset, a screen filled with E's). `clean` removes every one of them, whole: string
sequences (OSC, DCS, SOS, PM, APC, in their 7- and 8-bit forms, ended by BEL or ST, or by
the end of the text), CSI, the other ESC sequences, the C1 controls and every C0 control
but tab; invalid text (lone surrogates) becomes U+FFFD. With no ESC, C1 or C0 left, no
sequence can form again. It is one pass of a regex whose every alternative is a run of
one class after another, so it never backtracks: linear in the text.

backends.logs.screen interprets these sequences (it draws what they draw); this module says
what they are and removes them.
"""

from __future__ import annotations

import re

LINE_CAP = 4096  # characters of one line kept to show or parse; a line beyond it is cut, the cut counted

# What ends a string sequence: BEL, ST (ESC \ or 0x9c), or CAN/SUB, which abort any
# sequence; an ESC that is not ST aborts it too and starts the next sequence.
_STRING_BODY = r"[^\x07\x18\x1a\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
STRING = r"(?:\x1b[\]P_^X]|[\x90\x98\x9d\x9e\x9f])" + _STRING_BODY
# CSI: parameters, intermediates, a final byte (missing at the end of a text).
CSI = r"(?:\x1b\[|\x9b)(?P<params>[0-?]*)(?P<inter>[ -/]*)(?P<final>[@-~])?"
# Any other ESC sequence: intermediates (`ESC ( 0`, `ESC # 8`), then a final byte (`ESC c`).
ESCAPE = r"\x1b(?P<einter>[ -/]*)(?P<efinal>[0-~])?"
# C0 but tab, DEL, C1; and characters that reorder or break what is around them without
# being seen (bidirectional overrides and isolates, the line and paragraph separators).
CONTROL = r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]"

_SEQUENCE = re.compile(f"{STRING}|{CSI}|{ESCAPE}|{CONTROL}")
_SURROGATE = re.compile(r"[\ud800-\udfff]")


def clean(text: str) -> str:
    """`text` with every control sequence and control character removed, tabs kept."""
    if text.isprintable():  # most text: nothing to do (tab and every control are not printable)
        return text
    return _SURROGATE.sub("\ufffd", _SEQUENCE.sub("", text))


def block(text: str) -> str:
    """Lines to print: each cleaned, the line breaks between them kept."""
    return "\n".join(clean(part) for part in text.split("\n"))


def line(text: str, cap: int = LINE_CAP) -> str:
    """One line to show: cleaned, line breaks as spaces, at most `cap` characters, a longer
    one ending in how much was cut."""
    text = clean(text.replace("\r\n", " ").replace("\n", " ").replace("\r", " "))
    if len(text) <= cap:
        return text
    return f"{text[:cap]}… [{len(text) - cap} characters cut]"


def value(obj):
    """A JSON-able value with every string in it (keys too) cleaned, for `--json` output."""
    if isinstance(obj, str):
        return clean(obj)
    if isinstance(obj, dict):
        return {value(k): value(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [value(v) for v in obj]
    return obj
