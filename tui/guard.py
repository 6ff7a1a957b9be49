"""Unexpected errors in the dashboard's own code become alerts, never a dead dashboard.

Textual's answer to an exception in a handler is to exit the app, and the message pump
that raised stops reading messages for good. An operator about to press the kill key
needs the dashboard alive, so every handler, action, render and callback of ours is
wrapped: the error is logged with its traceback (`error_log`) and shown as an alert
naming where it happened, and the handler returns as if it had done nothing.

Exceptions raised inside Textual itself still reach Textual's handler; the app logs them
there too before Textual exits (`TracksideApp.survives_textual_error`).
"""

from __future__ import annotations

import functools
import inspect
import os
import time
import traceback
from collections.abc import Callable

from rich.text import Text
from textual.app import App
from textual.screen import Screen
from textual.strip import Strip

from tui.textual_compat import is_on_handler

# What Textual calls on our classes: handlers, actions, keys, watchers, renders, and the
# screens' state hook. Generators (compose) are left alone: a half-composed screen is
# worse than the exception that explains it.
_GUARDED_PREFIXES = ("on_", "action_", "key_", "watch_")
_GUARDED_NAMES = {"render", "render_line", "recompose", "state_changed", "check_action", "show", "show_run"}


def error_log_path(runs_root: str) -> str:
    """The dashboard's error log: beside the run dirs it supervises on this machine."""
    return os.path.join(os.path.expanduser(runs_root), "dashboard-errors.log")


def write_error(path: str, where: str, error: BaseException) -> None:
    """Append the traceback; a log that cannot be written must not raise again."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "a", encoding="utf-8") as log:
            log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} in {where}\n")
            log.write("".join(traceback.format_exception(error)))
    except OSError:
        pass


def _report(owner: object, where: str, error: Exception) -> None:
    try:
        app = owner if isinstance(owner, App) else owner.app  # type: ignore[attr-defined]
        app.report_error(where, error)
    except Exception:
        pass  # no app to tell (shutting down): the error dies here rather than the app


def _fallback(name: str, owner: object, error: Exception):
    """What a failed method returns: a visible mark for a render, else None."""
    if name == "render":
        return Text(f"⚠ {type(error).__name__}: {error}", style="bold red")
    if name == "render_line":
        return Strip.blank(owner.size.width)  # type: ignore[attr-defined]
    return None


def _not_in_view(owner: object, name: str) -> bool:
    """A key's action for a screen not (or no longer) in view: queued while the screen was
    being left (Escape, Escape in one breath) or before it had composed (Enter, x), it
    would find its widgets missing."""
    if not (isinstance(owner, Screen) and name.startswith(("action_", "key_"))):
        return False
    try:
        return owner.app.screen is not owner or not owner.is_mounted
    except Exception:
        return True  # no screen at all: the app is closing


def guard(method: Callable, where: str) -> Callable:
    """`method` with its exceptions reported instead of raised; a screen's key action
    arriving while the screen is not in view does nothing."""
    name = method.__name__
    if inspect.iscoroutinefunction(method):

        @functools.wraps(method)
        async def guarded_async(self, *args, **kwargs):
            if _not_in_view(self, name):
                return None
            try:
                return await method(self, *args, **kwargs)
            except Exception as error:
                _report(self, where, error)
                return _fallback(name, self, error)

        return guarded_async

    @functools.wraps(method)
    def guarded(self, *args, **kwargs):
        if _not_in_view(self, name):
            return None
        try:
            return method(self, *args, **kwargs)
        except Exception as error:
            _report(self, where, error)
            return _fallback(name, self, error)

    return guarded


def guarded_callback(owner: object, callback: Callable, where: str) -> Callable:
    """A plain callback (a dialog's answer) reported like a method."""

    @functools.wraps(callback)
    def call(*args):
        try:
            return callback(*args)
        except Exception as error:
            _report(owner, where, error)

    return call


class Guarded:
    """Mix into every App, Screen and Widget class of ours: their handlers get guarded."""

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        for name, value in list(vars(cls).items()):
            if not inspect.isfunction(value) or inspect.isgeneratorfunction(value) or inspect.isasyncgenfunction(value):
                continue
            if is_on_handler(value) or getattr(value, "__wrapped__", None) is not None:
                continue  # @on handlers are registered by Textual's metaclass as written
            if name in _GUARDED_NAMES or name.startswith(_GUARDED_PREFIXES):
                setattr(cls, name, guard(value, f"{cls.__name__}.{name}"))
