"""Every touch of Textual's internals (and textual-serve's), in one module.

The dashboard works around a few of Textual's behaviours by reaching names Textual keeps
private. Each such name is reached here and nowhere else, so an upgrade has one file to
re-read (tests/tui/test_textual_compat.py lists them, and fails on one reached or
overridden elsewhere); each says why it is private and what breaks without it. Each touch was checked on the versions in CHECKED_ON:
tests/tui/test_textual_compat.py fails on any other, so whoever upgrades re-checks each
one (the test exercises each against the installed Textual), then moves CHECKED_ON.

Every touch is written so that a Textual without the internal loses the workaround, not
the dashboard. Textual itself is imported only inside the functions: `trackside serve`'s
web server reaches textual-serve's internal through this module and never loads Textual.
"""

from __future__ import annotations

import traceback
from functools import lru_cache

CHECKED_ON = {"textual": "8.2.8", "textual-serve": "1.1.3"}


class TextualErrorHook:
    """Mixed into an App, before Textual's: Textual's handler of an exception raised inside
    Textual (`App._handle_exception`, private: it exits the app) asks the app's
    `survives_textual_error(error)` first, and exits only where that says no.

    Why private: Textual offers no public hook between an error inside its own code and
    the app's exit. Without it, an error in a part of Textual's the dashboard can lose (its
    command palette's search, tui/guard.py) ends the dashboard and every watch with it."""

    def survives_textual_error(self, error: Exception) -> bool:
        return False

    def _handle_exception(self, error: Exception) -> None:
        if not self.survives_textual_error(error):
            super()._handle_exception(error)  # type: ignore[misc]


def raised_in_command_palette(error: BaseException) -> bool:
    """Whether `error` was raised in the source of Textual's command palette."""
    return any(frame.filename.replace("\\", "/").endswith("textual/command.py")
               for frame in traceback.extract_tb(error.__traceback__))  # fmt: skip


class CommandPaletteFixes:
    """Mixed into a CommandPalette, before Textual's: two of its private steps made safe.

    `_action_command_list` passes Page Down or Page Up to the palette's OptionList, which
    raises KeyError while the list has options but no layout yet (the keys arrive in the
    same breath as ctrl+p or a search letter): here the key does nothing, as it would on
    an empty list. `_select_or_command` runs on Enter, and a palette closes by popping
    whatever screen is on top: an Enter queued behind the one that ran a command popped
    the screen under the palette, then no screen at all. Here a palette no longer on top
    selects nothing.

    Why private: the palette's key bindings and its Enter name these steps, and no public
    method stands between them. A Textual that renames either never calls these, and the
    two crashes the monkeys found (tests/tui/monkey.py) end the dashboard again."""

    def _action_command_list(self, action: str) -> None:
        try:
            super()._action_command_list(action)  # type: ignore[misc]
        except KeyError:
            pass  # the list is not laid out yet: nothing to move through

    def _select_or_command(self, *args, **kwargs) -> None:
        if self.app.screen is self:  # type: ignore[attr-defined]
            super()._select_or_command(*args, **kwargs)  # type: ignore[misc]


def shrink_escape_cache(maxsize: int) -> None:
    """Shrink Textual's cache of a style's terminal escapes (`Strip.render_ansi`, an
    lru_cache of 16,384 entries) to `maxsize`; a Textual that keeps it otherwise keeps its
    own size.

    Why: Textual has no setting for the cache's size, and under a scrolling log nearly
    every style is new (tui/escape_cache.py). Without it the cache fills to its 16,384
    entries and the dashboard's memory with it."""
    from textual.strip import Strip

    try:
        render_ansi = Strip.render_ansi.__func__
        if render_ansi.cache_parameters()["maxsize"] > maxsize:
            Strip.render_ansi = classmethod(lru_cache(maxsize)(render_ansi.__wrapped__))
    except Exception:
        return


def write_to_terminal(app, text: str) -> bool:
    """Write `text` to the terminal through the app's driver (`App._driver`: Textual writes
    its own escapes, the clipboard's, that way, and offers no public handle); False where
    there is none to write to.

    Why: an alert's desktop notification is an escape (OSC 9/777, tui/alerts.py) that
    only the terminal reads, and Textual's public output (notify, bell) has none. Without
    it the alert still shows in the app; the desktop is not told."""
    write = getattr(getattr(app, "_driver", None), "write", None)
    if write is None:
        return False
    write(text)
    return True


def footer_key() -> type | None:
    """Textual's Footer's key widget (`FooterKey`, in the private textual.widgets._footer:
    textual.widgets does not export it); None where there is none.

    Why: the dashboard's footer makes its keys itself (tui/widgets/footer.py says why)
    with Textual's widget, so they look, click and take the theme as Textual's do. Without
    it the footer is Textual's own, every key and its leak."""
    try:
        from textual.widgets._footer import FooterKey
    except ImportError:
        return None
    return FooterKey


def is_on_handler(function) -> bool:
    """Whether `function` is decorated with Textual's `@on` (which marks it `_textual_on`
    for its metaclass to register as written).

    Why: tui/guard.py wraps our handlers, and a wrapped `@on` handler would lose the mark
    its registration reads; Textual has no public test for the decorator. Without it an
    `@on` handler is guarded as any other and Textual never calls it."""
    return hasattr(function, "_textual_on")


def app_service_process(service):
    """The process of textual-serve's AppService (`_process`, private): None where it keeps
    none.

    Why: AppService's public stop asks the dashboard to quit and gives no way to make it;
    tui/serve/server.py kills one that has not quit in time. Without it such a dashboard
    lives on until its stdin's EOF reaches it."""
    return getattr(service, "_process", None)
