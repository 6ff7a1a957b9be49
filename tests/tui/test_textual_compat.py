"""Each touch of Textual's internals (tui/textual_compat.py), exercised against the
installed Textual and textual-serve.

The first test fails on any version but the one each touch was checked on: whoever
upgrades re-reads each touch in tui/textual_compat.py, runs the rest, then moves
CHECKED_ON.
"""

from __future__ import annotations

import ast
import asyncio
import functools
import gc
import importlib
import inspect
import pkgutil
import re
import sys
import textwrap
import weakref
from importlib.metadata import version
from importlib.util import find_spec
from pathlib import Path

import pytest
from rich.color import ColorSystem
from rich.style import Style
from textual import on
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.command import CommandList, Hit
from textual.command import CommandPalette as TextualCommandPalette
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.strip import Strip
from textual.widgets import Button, DataTable, Footer
from textual.widgets.option_list import Option
from textual_serve.app_service import AppService
from textual_serve.download_manager import DownloadManager

import tui
from scripts.sample import feed, make_app
from tui import textual_compat
from tui.screens.palette import CommandPalette
from tui.widgets import footer as footer_module
from tui.widgets.footer import Footer as TracksideFooter


def test_checked_on_the_installed_versions():
    installed = {name: version(name) for name in textual_compat.CHECKED_ON}
    assert installed == textual_compat.CHECKED_ON, (
        f"Textual is now {installed}; tui/textual_compat.py's touches were checked on "
        f"{textual_compat.CHECKED_ON}: re-check each against the new source, then move CHECKED_ON"
    )


ROOT = Path(__file__).resolve().parents[2]
# Every private name of Textual's (or textual-serve's) the dashboard reaches: each in
# tui/textual_compat.py, which says why and what breaks without it. (Two more touches use
# public names in ways Textual did not offer: the escape cache's size, and which of
# Textual's files an error was raised in.)
TOUCHES = {
    "_handle_exception",  # TextualErrorHook: an error inside Textual asks the app first
    "_action_command_list", "_select_or_command",  # CommandPaletteFixes: two palette crashes
    "_driver",  # write_to_terminal: an alert's desktop notification
    "textual.widgets._footer",  # footer_key: the footer's keys, Textual's widget
    "_textual_on",  # is_on_handler: guard.py leaves an @on handler as written
    "_process",  # app_service_process: a served dashboard that will not quit is killed
}
PRIVATE = re.compile(r"^_{1,2}[a-z]\w*(?<!__)$")  # not a dunder


def framework_privates() -> set[str]:
    """The private names Textual's and textual-serve's sources define or look up by name."""
    names = set()
    for package in ("textual", "textual_serve"):
        for path in Path(find_spec(package).origin).parent.rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            names.update(re.findall(r"\bdef (_[a-z]\w*)", text))
            names.update(re.findall(r"\bself\.(_[a-z]\w*)\s*(?::[^=\n]*)?=", text))
            names.update(re.findall(r"^\s+(_[a-z]\w*)\s*[:=]", text, re.M))
            names.update(re.findall(r"""["'](_{1,2}[a-z]\w*)["']""", text))
    return {name for name in names if not name.endswith("__")}


def reached(framework: set[str]) -> set[tuple[str, str]]:
    """(file, name) for each private name of the framework's that tui/ reaches on another
    object (`app._driver`, `getattr(x, "_process")`) or imports from a private module."""
    found = set()
    for path in sorted((ROOT / "tui").rglob("*.py")):
        where = str(path.relative_to(ROOT))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr in framework and not (
                    isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):  # fmt: skip
                found.add((where, node.attr))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in framework:
                found.add((where, node.value))
            elif isinstance(node, ast.ImportFrom) and node.module and any(PRIVATE.match(p) for p in node.module.split(".")):
                found.add((where, node.module))
    return found


@functools.cache
def source_of(cls) -> str:
    return inspect.getsource(cls)


@functools.cache
def privates_of(base) -> set[str]:
    """A framework class's private attributes and methods, and what it sets on self."""
    names = {name for name in vars(base) if PRIVATE.match(name)}
    return names | set(re.findall(r"self\.(_[a-z]\w*)\s*(?::[^=\n]*)?=", source_of(base)))


def overridden() -> set[tuple[str, str]]:
    """(file, name) for each private name of a Textual class that a class of ours, or a
    mixin of ours beside it, defines or sets on self: an override of Textual's internals,
    meant or by a clash of names."""
    def framework(cls) -> bool:
        return cls.__module__.split(".")[0] in ("textual", "textual_serve")

    found = set()
    modules = [importlib.import_module(m.name) for m in pkgutil.walk_packages(tui.__path__, "tui.")]
    for module in modules:
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != module.__name__ or not any(framework(base) for base in cls.__mro__):
                continue
            private = set().union(*map(privates_of, filter(framework, cls.__mro__)))
            for ours in (c for c in cls.__mro__ if c.__module__.startswith("tui.")):
                source = source_of(ours)
                body = ast.parse(textwrap.dedent(source)).body[0].body
                names = {n.name for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
                names |= {t.id for n in body if isinstance(n, (ast.Assign, ast.AnnAssign))
                          for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}  # fmt: skip
                names |= set(re.findall(r"self\.(_[a-z]\w*)", source))
                where = str(Path(inspect.getsourcefile(ours)).relative_to(ROOT))
                found.update((where, name) for name in names & private)
    return found


def test_every_touch_of_textuals_internals_is_one_of_textual_compats():
    framework = framework_privates()
    assert {"_driver", "_handle_exception", "_bindings_ready", "__watchers"} <= framework  # the walk reads them
    touches = reached(framework) | overridden()
    assert touches == {("tui/textual_compat.py", name) for name in TOUCHES}


class Hooked(textual_compat.TextualErrorHook, App):
    def __init__(self) -> None:
        super().__init__()
        self.asked: list[Exception] = []

    def survives_textual_error(self, error: Exception) -> bool:
        self.asked.append(error)
        return True


async def test_textuals_exception_handler_asks_the_app_first():
    """A worker with exit_on_error failing ends the app in Textual's handler: asked first."""
    app = Hooked()

    async def failing():
        raise LookupError("inside a worker of Textual's")

    async with app.run_test() as pilot:
        app.run_worker(failing(), exit_on_error=True)
        await pilot.pause(0.2)
        assert app.is_running and app.return_code is None
        assert [type(e).__name__ for e in app.asked] == ["WorkerFailed"]


async def test_an_error_raised_in_the_command_palette_is_known_as_its():
    palette = TextualCommandPalette()  # not mounted: its list lookup raises from its own source
    with pytest.raises(NoMatches) as raised:
        palette._action_command_list("cursor_down")
    assert textual_compat.raised_in_command_palette(raised.value)
    try:
        Screen().query_one(CommandList)
    except NoMatches as elsewhere:
        assert not textual_compat.raised_in_command_palette(elsewhere)


async def test_page_down_before_the_palettes_list_is_laid_out_does_nothing():
    for palette_class, raises in ((TextualCommandPalette, True), (CommandPalette, False)):
        app = App()
        async with app.run_test():
            palette = palette_class()
            await app.push_screen(palette)
            commands = palette.query_one(CommandList)
            commands.add_options([Option(str(i)) for i in range(30)])
            commands.highlighted = 0  # options, no layout yet: Textual's page down looks up its lines
            if raises:
                with pytest.raises(KeyError):
                    palette._action_command_list("page_down")
            else:
                palette._action_command_list("page_down")


async def test_a_palette_no_longer_on_top_runs_no_command():
    app = App()
    ran: list[str] = []
    async with app.run_test() as pilot:
        for on_top in (False, True):
            palette = CommandPalette()
            await app.push_screen(palette)
            palette._selected_command = Hit(1, "command", lambda on_top=on_top: ran.append(on_top))
            if not on_top:
                await app.push_screen(Screen())
            palette._select_or_command()
            await pilot.pause()
            if not on_top:
                assert isinstance(app.screen, Screen) and app.screen.is_mounted and app.screen is not palette
                app.pop_screen()
                await pilot.pause()
                palette.dismiss()  # stays open: the next one goes on top of it
        assert ran == [True]  # Textual's step ran the command where the palette was on top


def test_the_escape_cache_shrinks_and_renders_the_same(monkeypatch):
    monkeypatch.setattr(Strip, "render_ansi", Strip.render_ansi)  # put back after the test
    textual_compat.shrink_escape_cache(64)
    render_ansi = Strip.render_ansi.__func__
    assert render_ansi.cache_parameters()["maxsize"] == 64
    style = Style(bold=True, color="red")
    assert Strip.render_ansi(style, ColorSystem.TRUECOLOR) == render_ansi.__wrapped__(Strip, style, ColorSystem.TRUECOLOR)
    # A Textual without the lru_cache keeps its own: nothing happens.
    monkeypatch.setattr(Strip, "render_ansi", classmethod(lambda cls, style, color_system: ""))
    textual_compat.shrink_escape_cache(64)
    assert Strip.render_ansi(style, ColorSystem.TRUECOLOR) == ""


async def test_text_reaches_the_apps_terminal_driver():
    app = App()
    written: list[str] = []
    async with app.run_test():
        app._driver.write = written.append  # the headless driver draws nowhere: record
        assert textual_compat.write_to_terminal(app, "\x1b]9;hello\x07")
    assert written == ["\x1b]9;hello\x07"]
    assert not textual_compat.write_to_terminal(App(), "never started: no driver")


class WithFooter(App):
    BINDINGS = [Binding("k", "kill", "Kill"), Binding("e", "edit", "Edit")]

    def compose(self) -> ComposeResult:
        yield Footer()


async def test_the_footers_key_is_the_one_textuals_footer_makes():
    app = WithFooter()
    async with app.run_test() as pilot:
        await pilot.pause()
        keys = app.query_one(Footer).children
        assert [key.action for key in keys] == ["kill", "edit", "command_palette"]
        assert all(type(key) is textual_compat.footer_key() for key in keys)


async def test_a_recomposed_footer_keeps_no_replaced_key_alive():
    """Textual's Footer binds each key's style to itself (data_bind), and that watcher kept
    every replaced key alive until the footer's style next changed (Textualize/textual#6666):
    moving the cursor between a host and a run, which enables and dims `k`, grew the app."""
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await feed(pilot)
        footer = app.screen.query_one(TracksideFooter)
        table = app.screen.query_one(DataTable)
        replaced = [weakref.ref(key) for key in footer.children]
        for row in (0, 1, 0, 1):  # a host row (k dimmed), the run's row (k enabled)
            table.move_cursor(row=row)
            await pilot.pause()
        assert not any(ref() in footer.children for ref in replaced)  # the keys were replaced
        gc.collect()
        assert [ref() for ref in replaced if ref() is not None] == []


async def test_without_textuals_key_widget_the_footer_is_textuals(monkeypatch):
    monkeypatch.setattr(footer_module, "FooterKey", None)
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await feed(pilot)
        footer = app.screen.query_one(TracksideFooter)
        assert [key.action for key in footer.children][:2] == ["kill", "edit"]


def test_on_handlers_are_told_apart():
    @on(Button.Pressed)
    def pressed(self, event) -> None: ...

    def plain(self) -> None: ...

    assert textual_compat.is_on_handler(pressed) and not textual_compat.is_on_handler(plain)


async def test_textual_serves_app_process_is_reached():
    async def ignore(*_) -> None: ...

    # `exec`: textual-serve starts the command with a shell, and a shell that forked it
    # instead would leave it holding the pipes the kill below waits to see closed.
    service = AppService(f"exec {sys.executable} -c 'import time; time.sleep(30)'", write_bytes=ignore, write_str=ignore,
                         close=ignore, download_manager=DownloadManager())  # fmt: skip
    assert textual_compat.app_service_process(service) is None  # not started
    await service.start(80, 24)
    process = textual_compat.app_service_process(service)
    try:
        assert process is not None and process.returncode is None
    finally:
        process.kill()
        await asyncio.wait_for(process.wait(), 10)
