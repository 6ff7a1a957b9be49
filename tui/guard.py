"""What becomes of an unexpected error: one policy, the App's (`ErrorPolicy`).

Textual's answer to an exception in a handler is to exit the app, and the message pump
that raised stops reading messages for good. An operator about to press the kill key
needs the dashboard alive, so every handler, action, render and callback of ours is
wrapped (`Guarded`) and hands its error to the app's policy: logged with its traceback
(`error_log`), shown as an alert naming where it happened, and the handler returns as if
it had done nothing. Exceptions raised inside Textual itself reach Textual's handler
(`App._handle_exception`), which asks the same policy: it survives those that stop only a
part of Textual's own and lets Textual exit on the rest, logged.

The tests' mode (`RAISE_ERRORS_ENV` set to 1, or the app's `raise_errors`) survives
nothing unexpected: the error goes on to Textual's handler, which ends the app, and a
Pilot test fails on the traceback instead of reading past an alert.
"""

from __future__ import annotations

import functools
import inspect
import os
import time
import traceback
from collections.abc import Callable

from rich.text import Text
from textual.app import ScreenStackError
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.strip import Strip
from textual.worker import Worker, WorkerFailed, WorkerState

from tui.textual_compat import TextualErrorHook, is_on_handler, raised_in_command_palette

REPORT_EVERY_S = 30.0  # each place and kind of error is shown at most this often
RAISE_ERRORS_ENV = "TRACKSIDE_RAISE_ERRORS"  # "1": the tests' mode, an unexpected error ends the app

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
    """Hand `error` to the app's policy; with no app of ours to tell, it goes on up."""
    try:
        app = owner if isinstance(owner, ErrorPolicy) else owner.app  # type: ignore[attr-defined]
    except RuntimeError:  # Textual's NoActiveAppError: the app has closed
        return  # no app to tell: the error dies here rather than the app
    if not isinstance(app, ErrorPolicy):
        raise error
    app.report_error(where, error)


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


class ErrorPolicy(TextualErrorHook, Guarded):
    """Mixed into the App: what becomes of an error, ours or Textual's. The app sets
    `error_log`, where the tracebacks go, and `raise_errors`, the tests' mode."""

    error_log: str
    raise_errors = False
    errors = 0  # unexpected errors caught since start
    textual_errors = 0  # failures inside Textual, survived

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._reported: dict[tuple[str, type], float] = {}  # when each cause was last shown

    def report_error(self, where: str, error: Exception) -> None:
        """An error in our own code: logged with its traceback, shown, and survived; in the
        tests' mode, raised on to Textual's handler, which ends the app with it.

        A broken render fails on every frame: each place and kind of error is logged and
        shown once per REPORT_EVERY_S, the rest only counted."""
        if self.raise_errors:
            raise error
        self.errors += 1
        now, cause = time.monotonic(), (where, type(error))
        if now - self._reported.get(cause, -REPORT_EVERY_S) < REPORT_EVERY_S:
            return
        self._reported[cause] = now
        write_error(self.error_log, where, error)
        self.notify(  # type: ignore[attr-defined]
            f"internal error in {where}: {type(error).__name__}: {error} — the dashboard goes on; "
            f"traceback in {self.error_log}",
            title="internal error",
            severity="error",
            timeout=15,
        )

    def survives_textual_error(self, error: Exception) -> bool:
        # Asked by Textual's own handler (which exits the app). Errors in our code never
        # get here but in the tests' mode (the guard above; our workers don't exit on error). A worker of
        # Textual's own failing (its command palette's search, when the palette closes
        # under it) stops only that worker, no message pump with it: logged, survived.
        # Anything else from inside Textual is logged before Textual exits.
        if isinstance(error, WorkerFailed):
            self.textual_errors += 1
            write_error(self.error_log, "a worker of Textual's (survived)", error.error)
            return True
        if isinstance(error, NoMatches) and raised_in_command_palette(error):
            # The palette looking up its own list after the list is gone (its "no matches"
            # countdown ending as it closes): only that callback is dropped, its screen's
            # message pump goes on. Logged, survived.
            self.textual_errors += 1
            write_error(self.error_log, "Textual's command palette (survived)", error)
            return True
        if isinstance(error, ScreenStackError) and not self.screen_stack:  # type: ignore[attr-defined]
            # A key still queued as the app closes meets no screen in Textual's handler:
            # the app is ending anyway, and ends as it was asked to, not on an error.
            write_error(self.error_log, "Textual, while closing (ignored)", error)
            return True
        # Ours too, in the tests' mode (report_error raised it on).
        write_error(self.error_log, "unhandled: the app ends", error)
        return False

    def push_screen(self, screen, callback=None, *args, **kwargs):
        # A dialog's answer runs our code outside any handler: guard it like one.
        if callback is not None:
            callback = guarded_callback(self, callback, f"{type(screen).__name__}'s answer")
        return super().push_screen(screen, callback, *args, **kwargs)  # type: ignore[misc]

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        # Workers run with exit_on_error=False: a failure would otherwise pass unseen.
        if event.state == WorkerState.ERROR and event.worker.error is not None:
            self.report_error(f"worker {event.worker.name or event.worker.group}", event.worker.error)
