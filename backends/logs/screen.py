"""What a terminal shows of the bytes a pane printed: the text parsed is the text drawn.

A recorded line holds every redraw of a tqdm or Rich bar and every escape the program
wrote. `Terminal` replays them as a terminal draws them — carriage return, backspace,
tab, cursor moves (CUU/CUD/CUF/CUB/CNL/CPL/CHA/CUP/VPA, save and restore), erasing
(EL/ED/ECH/DCH/ICH/IL/DL), the reset `ESC c`, concealed text (SGR 8) and the DEC
line-drawing character set — and says each state a line was drawn in: a line's text when
the cursor goes back to its start (a carriage return: tqdm's redraw) or leaves it (a line
feed, a move up: Rich's redraw of its live lines). What was erased or drawn over before
then was never a state of the line, so it is never read; every sequence is consumed, so
no state holds one.

A recording has no times, so a state's text is taken as shown: the one a line held when
its program went back to its start (tqdm's and Rich's contract). A recording knows no
width either: with `width` None, a carriage return goes back to the start of the line
written (right whenever a line fits its pane); with one, rows wrap at it as a terminal's
do. Lines are at most LINE_CAP characters (what is written past it is counted in `cut`),
and at most KEPT lines above the cursor are kept: memory is bounded whatever a pane
prints, and time is linear in it.
"""

from __future__ import annotations

import re

from backends.sanitize import CONTROL, CSI, ESCAPE, LINE_CAP, STRING

KEPT = 64  # lines above the cursor a move up can reach (Rich's live display redraws that many)
_TAB = 8
_TOKENS = re.compile(f"(?P<text>[^\\x00-\\x1f\\x7f-\\x9f\\u2028\\u2029\\u202a-\\u202e\\u2066-\\u2069\\ud800-\\udfff]+)"
                     f"|(?P<csi>{CSI})|(?P<string>{STRING})|(?P<esc>{ESCAPE})|(?P<ctl>{CONTROL}|\\t|[\\ud800-\\udfff])")  # fmt: skip
# The rest of a sequence a feed ended in, swallowed at the start of the next: a string
# sequence's, or a CSI's or other ESC sequence's too long to carry (and so ignored whole).
_REST = {
    "string": re.compile(r"[^\x07\x18\x1a\x1b\x9c]*(?P<end>\x07|\x1b\\|\x9c)?"),
    "csi": re.compile(r"[0-?]*[ -/]*(?P<end>[@-~])?"),
    "esc": re.compile(r"[ -/]*(?P<end>[0-~])?"),
}
_CARRY_MAX = 64  # a CSI or ESC sequence longer than this is ignored (no terminal's has such)
# DEC special graphics (VT100), the character set `ESC ( 0` selects: its lines and blocks.
_DEC = str.maketrans(dict(zip("`abcdefghijklmnopqrstuvwxyz{|}~", "◆▒␉␌␍␊°±␤␋┘┐┌└┼⎺⎻─⎼⎽├┤┴┬│≤≥π≠£·")))


class Terminal:
    """A terminal's lines as a program draws them; `feed` says the states drawn."""

    def __init__(self, width: int | None = None) -> None:
        self.width = width if width and width > 0 else None
        self.cut = 0  # characters written past LINE_CAP, not kept
        self._lines: list[str] = [""]
        self._y = 0  # the cursor's line, in _lines
        self._x = 0  # its column in that line (a wrapped line's later rows continue it)
        self._wrap = False  # the last character written filled a row: the next one starts the next
        self._dirty = False  # the cursor's line was drawn on since its last state
        self._over = False  # the cursor's line was written past LINE_CAP
        self._saved = (0, 0)  # DECSC: lines above the last one, column
        self._conceal = False
        self._g = ["B", "B"]  # G0, G1: B is ASCII, 0 DEC graphics
        self._shift = 0  # SO selects G1, SI G0
        self._carry = ""  # an unfinished sequence at the end of the last feed, short
        self._rest: re.Pattern | None = None  # inside a sequence begun in an earlier feed

    # --- what it says -----------------------------------------------------------------

    def feed(self, text: str) -> list[str]:
        """Draw `text`; the states of lines completed in it, oldest first (blank ones left out)."""
        states: list[str] = []
        text, self._carry = self._carry + text, ""
        pos = 0
        if self._rest is not None:
            rest = self._rest.match(text)
            pos = rest.end()
            if rest["end"] or pos < len(text):
                self._rest = None
        for m in _TOKENS.finditer(text, pos):
            kind = m.lastgroup
            if kind == "text":
                self._print(m[0])
            elif kind == "ctl":
                self._control(m[0], states)
            elif m.end() == len(text) and self._unfinished(m):
                break
            elif kind == "csi":
                self._csi(m["params"], m["inter"], m["final"] or "", states)
            elif kind == "esc":
                self._escape(m["einter"] + (m["efinal"] or ""), states)
        return states

    def line(self) -> str:
        """The cursor's line as it stands; one cut at LINE_CAP ends in `…`, so no number
        is read that its cut shortened."""
        return self._lines[self._y].rstrip() + ("…" if self._over else "")

    def drawing(self) -> str:
        """The cursor's line as drawn so far, not yet a state ('' when drawn as one)."""
        return self.line() if self._dirty else ""

    def take(self) -> str:
        """The cursor's line as drawn so far, as a state: it is one again only when drawn on."""
        text, self._dirty = self.drawing(), False
        return text

    def flush(self) -> list[str]:
        """Nothing more is coming: the line being drawn is a state."""
        text = self.take()
        return [text] if text.strip() else []

    # --- drawing ----------------------------------------------------------------------

    def _unfinished(self, m: re.Match) -> bool:
        """A sequence the end of this feed cut: kept for the next one, or swallowed."""
        if m.lastgroup == "string":
            if m[0].endswith(("\x07", "\x9c", "\x1b\\")):
                return False
            self._rest = _REST["string"]
            return True
        if (m.lastgroup == "csi" and m["final"] is None) or (m.lastgroup == "esc" and m["efinal"] is None):
            if len(m[0]) <= _CARRY_MAX:
                self._carry = m[0]
            else:
                self._rest = _REST[m.lastgroup]
            return True
        return False

    def _print(self, run: str) -> None:
        if self._g[self._shift] == "0":
            run = run.translate(_DEC)
        if self._conceal:
            run = " " * len(run)
        width = self.width
        if width is None:
            self._put(run)
            return
        while run:  # a row filled leaves the cursor at the next one's start, in this line
            room = width - self._x % width
            part, run = run[:room], run[room:]
            self._put(part)
            self._wrap = self._x % width == 0

    def _put(self, run: str) -> None:
        """Write `run` over the line at the cursor, advancing it; past LINE_CAP is counted only."""
        x, line = self._x, self._lines[self._y]
        kept = run[: max(0, LINE_CAP - x)]
        if len(kept) < len(run):
            self.cut += len(run) - len(kept)
            self._over = True
        if kept:
            if len(line) < x:
                line += " " * (x - len(line))
            self._lines[self._y] = line[:x] + kept + line[x + len(kept) :]
            self._dirty = True
        self._x = x + len(run)

    def _row_start(self) -> int:
        """The column where the cursor's row starts: 0, or a wrapped row's first."""
        if self.width is None:
            return 0
        x = self._x - 1 if self._wrap else self._x
        return x - x % self.width

    def _row_end(self) -> int:
        return LINE_CAP if self.width is None else self._row_start() + self.width

    def _rows(self, y: int) -> int:
        """How many rows line `y` takes."""
        if self.width is None:
            return 1
        return max(1, -(-len(self._lines[y].rstrip()) // self.width))

    def _state(self, states: list[str]) -> None:
        text = self.take()
        if text.strip():
            states.append(text)

    def _column(self, x: int) -> None:
        self._x, self._wrap = max(self._row_start(), min(x, self._row_end() - 1)), False

    def _move_to(self, y: int, column: int, states: list[str]) -> None:
        """To line `y` (clamped to the lines kept), at `column` of its row; a line left is a state."""
        y = max(0, min(y, len(self._lines) - 1))
        if y != self._y:
            self._state(states)
            self._y, self._over = y, False
        self._x, self._wrap = max(0, min(column, LINE_CAP)), False

    def _down(self, states: list[str]) -> None:
        """A line feed (taken as CR LF: a pane's tty writes one for a newline)."""
        self._state(states)
        self._y += 1
        self._over = False
        if self._y == len(self._lines):
            self._lines.append("")
            if len(self._lines) > KEPT:
                del self._lines[0]
                self._y -= 1
        self._x, self._wrap = 0, False

    def _vertical(self, n: int, states: list[str]) -> None:
        """Up (n < 0) or down n rows, at the same column of the row: within a wrapped line
        first, then into the lines around it."""
        width, column = self.width, self._x - self._row_start()
        row = 0 if width is None else self._row_start() // width
        y = self._y
        target = row + n
        while target < 0 and y > 0:
            y -= 1
            target += self._rows(y)
        while y < len(self._lines) - 1 and target >= self._rows(y):
            target -= self._rows(y)
            y += 1
        target = max(0, min(target, self._rows(y) - 1))
        self._move_to(y, target * (width or 0) + column, states)

    def _erase(self, start: int, end: int) -> None:
        line = self._lines[self._y]
        if start < len(line):
            self._lines[self._y] = (line[:start] + " " * (min(end, len(line)) - start) + line[end:]).rstrip()

    def _reset(self) -> None:
        self._lines, self._y, self._x, self._wrap, self._dirty, self._over = [""], 0, 0, False, False, False
        self._conceal, self._g, self._shift, self._saved = False, ["B", "B"], 0, (0, 0)

    def _control(self, char: str, states: list[str]) -> None:
        if char == "\r":
            if self._dirty:
                self._state(states)
            self._x, self._wrap = self._row_start(), False
        elif char in "\n\x0b\x0c\x84\x85":  # LF, VT, FF, IND, NEL
            self._down(states)
        elif char == "\x08":
            self._x, self._wrap = (self._x - 1, False) if self._wrap else (max(self._row_start(), self._x - 1), False)
        elif char == "\t":
            stop = min(self._row_end() - 1, (self._x // _TAB + 1) * _TAB)
            self._x, self._wrap = max(self._x, stop), False
        elif char == "\x8d":  # RI
            self._vertical(-1, states)
        elif char in "\x0e\x0f":  # SO, SI
            self._shift = 1 if char == "\x0e" else 0
        elif "\ud800" <= char <= "\udfff":  # not text: shown as what stands for invalid text
            self._print("\ufffd")

    def _escape(self, seq: str, states: list[str]) -> None:
        if len(seq) > _CARRY_MAX:
            return
        if seq == "c":
            self._reset()
        elif seq in ("7", "8"):
            self._cursor_saved(seq == "7", states)
        elif seq in ("D", "E"):
            self._down(states)
        elif seq == "M":
            self._vertical(-1, states)
        elif len(seq) == 2 and seq[0] in "()":
            self._g["()".index(seq[0])] = "0" if seq[1] == "0" else "B"
        # Everything else (`ESC # 8`'s screen of E's, keypad modes, charsets of other
        # lands) draws no text of the program's: consumed.

    def _cursor_saved(self, save: bool, states: list[str]) -> None:
        if save:
            self._saved = len(self._lines) - 1 - self._y, self._x
        else:
            above, x = self._saved
            self._move_to(len(self._lines) - 1 - above, x, states)

    def _csi(self, params: str, inter: str, final: str, states: list[str]) -> None:
        if not final or inter or (params[:1] in "<=>?" and params) or len(params) + 2 > _CARRY_MAX:
            return  # cut short by another sequence; private modes (the cursor shown or hidden, the alternate screen...): nothing drawn
        args = [int(p) if p.isdigit() and len(p) < 6 else 0 for p in params.split(";")] if params else []
        n = max(1, args[0]) if args else 1
        start, x = self._row_start(), self._x
        if final in "AF":  # CUU, CPL
            self._vertical(-n, states)
            if final == "F":
                self._x = self._row_start()
        elif final in "BE":  # CUD, CNL
            self._vertical(n, states)
            if final == "E":
                self._x = self._row_start()
        elif final in "Ca":  # CUF
            self._column(x + n)
        elif final == "D":  # CUB
            self._column(x - n)
        elif final in "G`":  # CHA
            self._column(start + n - 1)
        elif final in "Hf":  # CUP: rows counted from the first line kept
            self._move_to(n - 1, 0, states)
            self._column(self._row_start() + (max(1, args[1]) if len(args) > 1 else 1) - 1)
        elif final == "d":  # VPA
            self._move_to(n - 1, x - start, states)
        elif final == "K":  # EL
            mode = args[0] if args else 0
            self._erase(*((x, self._row_end()), (start, x + 1), (start, self._row_end()))[mode if mode < 3 else 2])
        elif final == "J":  # ED
            self._erase_display(args[0] if args else 0, x)
        elif final == "X":  # ECH
            self._erase(x, min(x + n, self._row_end()))
        elif final in "P@":  # DCH, ICH
            line = self._lines[self._y]
            end = min(self._row_end(), max(len(line), x))
            row = line[x:end]
            row = row[n:] if final == "P" else (" " * n + row)[: end - x]
            self._lines[self._y] = (line[:x] + row.ljust(end - x) + line[end:]).rstrip()
        elif final in "LM":  # IL, DL: the lines below move down (off the bottom) or up
            self._state(states)
            if final == "L":
                self._lines[self._y : self._y] = [""] * min(n, KEPT)
                del self._lines[KEPT:]
            else:
                del self._lines[self._y : self._y + n]
                self._lines += [""] * (self._y + 1 - len(self._lines))
            self._x, self._wrap = 0, False
        elif final in "su":  # SCOSC, SCORC
            self._cursor_saved(final == "s", states)
        elif final == "m":
            for arg in args or [0]:
                if arg in (0, 8, 28):
                    self._conceal = arg == 8

    def _erase_display(self, mode: int, x: int) -> None:
        if mode == 0:
            self._erase(x, LINE_CAP)
            del self._lines[self._y + 1 :]
        elif mode == 1:
            self._erase(0, x + 1)
            self._lines[: self._y] = [""] * self._y
        else:
            self._lines = [""] * len(self._lines)
            self._dirty = False


def visible_text(line: str) -> str:
    """What a terminal would leave on screen of one captured line: its last row drawn, no
    escapes (tqdm redraws a bar in place with \\r, so a pane line holds every redraw)."""
    terminal = Terminal()
    terminal.feed(line.removesuffix("\n").removesuffix("\r"))
    return terminal.line()
