"""Textual's Footer, rebuilt only when the keys it shows change, compact when the keys
would not fit otherwise.

Textual's Footer recomposes on every `refresh_bindings`, and the dashboard refreshes
bindings on every poll (a listing may enable or disable `k`). Each recompose replaced
~12 key widgets, and the replaced ones stayed alive through their `data_bind` watcher on
the footer (Textualize/textual#6666): 25 widgets a second, the app's largest memory leak.
Here the footer recomposes only when its keys change, and makes its keys itself, each in
the footer's style, with no watcher on the footer to outlive it.

Textual's footer scrolls its keys under the palette key docked at its right: at 160
columns the run screen's fourteen keys lost `q Quit` under `^p palette`, and narrower a
key was cut mid-word. When the keys in the full style would not fit, the footer takes
Textual's compact style (one cell less per key), which holds them at 160; narrower still,
it leaves keys out whole, in the order of `tui.keys.FOOTER_FIRST`.

The keys are Textual's own widget (FooterKey, which textual.widgets does not export:
`tui.textual_compat.footer_key`), so they look and click as Textual's footer's do.
"""

from __future__ import annotations

from rich.cells import cell_len
from textual import events
from textual.app import ComposeResult
from textual.dom import NoScreen
from textual.widgets import Footer as TextualFooter
from textual.widgets import Label

from tui.guard import Guarded
from tui.keys import FOOTER_FIRST
from tui.textual_compat import footer_key

# Cells a key takes beside its key and description: the full style pads the key a cell
# each side and the description one after; the compact one has one space and one margin.
FULL_CELLS, COMPACT_CELLS = 3, 2
PALETTE_CELLS = 3  # its left border, the space after its key, its right padding
FooterKey = footer_key()


class Footer(Guarded, TextualFooter):
    DEFAULT_CSS = """
    Footer .read-only { width: auto; padding: 0 1; color: $text-warning; text-style: bold; }
    /* Textual's compact keys' margin put the palette key a cell short of the edge, where
       a cell of the keys scrolled under it showed ("paletten"). */
    Footer.-compact FooterKey.-command-palette { margin-right: 0; padding-right: 1; }
    """
    _shown: tuple | None = None  # what the keys showed at the last recompose

    def compose(self) -> ComposeResult:
        # Not Textual's compose: it binds each key's `compact` to this footer (data_bind),
        # and that watcher keeps a replaced key alive (Textualize/textual#6666).
        if FooterKey is None:  # a Textual without it: its own footer
            yield from super().compose()
            return
        compact, shown = self._plan()
        self.compact = compact
        try:
            active = self.screen.active_bindings
        except NoScreen:
            return
        keys, made = 0, set()
        for _, binding, enabled, tooltip in active.values():
            if binding.show and binding.action in shown and binding.action not in made:
                made.add(binding.action)  # one key an action, the first bound, as Textual's
                keys += 1
                key = FooterKey(binding.key, self.app.get_key_display(binding), binding.description, binding.action,
                                disabled=not enabled, tooltip=tooltip)  # fmt: skip
                key.set_reactive(FooterKey.compact, compact)
                key.set_class(compact, "-compact")  # what its watcher of `compact` does, once mounted
                yield key
        self.styles.grid_size_columns = keys
        palette = active.get(self.app.COMMAND_PALETTE_BINDING) if self.show_command_palette and self.app.ENABLE_COMMAND_PALETTE else None
        if palette is not None:
            _, binding, enabled, _ = palette
            # In Textual's footer too the palette key keeps its own style (compact), unbound.
            yield FooterKey(binding.key, self.app.get_key_display(binding), binding.description, binding.action,
                            classes="-command-palette", disabled=not enabled, tooltip=binding.tooltip or binding.description)  # fmt: skip
        # A read-only dashboard (`trackside serve --read-only`) says so where the missing
        # keys would be.
        if keys and self.app.read_only:
            self.styles.grid_size_columns = keys + 1
            yield Label("read-only: no kill, edit, relaunch, attach", classes="read-only")

    def _keys(self) -> tuple | None:
        """Everything the composed keys are made of; None once the footer has no screen
        (its screen is being popped while a recompose was queued)."""
        try:
            bindings = self.screen.active_bindings
        except NoScreen:
            return None
        return (
            self._plan(),
            self.show_command_palette,
            tuple(
                (binding.key, self.app.get_key_display(binding), binding.description, binding.show, enabled, tooltip)
                for _, binding, enabled, tooltip in bindings.values()
            ),
        )

    def _plan(self) -> tuple[bool, frozenset[str]]:
        """(compact, the actions whose keys are shown) at the footer's width."""
        try:
            active = self.screen.active_bindings
        except NoScreen:
            return False, frozenset()
        keys = {b.action: cell_len(self.app.get_key_display(b)) + cell_len(b.description)
                for _, b, _, _ in active.values() if b.show}  # fmt: skip
        room = self.size.width
        if self.show_command_palette and (palette := active.get(self.app.COMMAND_PALETTE_BINDING)):
            room -= cell_len(self.app.get_key_display(palette.binding)) + cell_len(palette.binding.description) + PALETTE_CELLS
        if not self.size.width or sum(keys.values()) + FULL_CELLS * len(keys) <= room:
            return False, frozenset(keys)  # not laid out yet, or all fit in full
        rank = {action: i for i, action in enumerate(FOOTER_FIRST)}
        shown, used = set(), 0
        for action in sorted(keys, key=lambda a: rank.get(a, len(rank))):
            if used + keys[action] + COMPACT_CELLS <= room:
                shown.add(action)
                used += keys[action] + COMPACT_CELLS
        return True, frozenset(shown)

    async def recompose(self) -> None:
        if not self.is_attached:
            return
        keys = self._keys()
        if keys is None or keys == self._shown:
            return
        self._shown = keys
        await super().recompose()

    async def on_resize(self, event: events.Resize) -> None:
        await self.recompose()  # only if the width changed which keys fit
