"""Textual's Footer, rebuilt only when the keys it shows change, compact when the keys
would not fit otherwise.

Textual's Footer recomposes on every `refresh_bindings`, and the dashboard refreshes
bindings on every poll (a listing may enable or disable `k`). Each recompose replaced
~12 key widgets, and the replaced ones stayed alive through their `data_bind` watcher on
the footer (Textualize/textual#6666): 25 widgets a second, the app's largest memory leak.

Textual's footer scrolls its keys under the palette key docked at its right: at 160
columns the run screen's fourteen keys lost `q Quit` under `^p palette`. When the keys in
the full style would not fit, the footer takes Textual's compact style (one cell less per
key), which holds them at 160.

The workarounds read Textual internals (`_bindings_ready`, the `__watchers` store, the
keys' `key_display` and `description`); each is written so that a Textual without them
loses the workaround, not the footer.
"""

from __future__ import annotations

from rich.cells import cell_len
from textual import events
from textual.app import ComposeResult
from textual.dom import NoScreen
from textual.widgets import Footer as TextualFooter
from textual.widgets import Label

from tui.guard import Guarded


class Footer(Guarded, TextualFooter):
    DEFAULT_CSS = """
    Footer .read-only { width: auto; padding: 0 1; color: $text-warning; text-style: bold; }
    """
    _shown: tuple | None = None  # what the keys showed at the last recompose

    def compose(self) -> ComposeResult:
        keys = 0
        for widget in super().compose():
            keys += 1
            yield widget
        # A read-only dashboard (`trackside serve --read-only`) says so where the missing
        # keys would be; not before the keys are ready, when the footer is empty.
        if keys and getattr(self.app, "read_only", False):
            self.styles.grid_size_columns = (self.styles.grid_size_columns or 0) + 1
            yield Label("read-only: no kill, edit, relaunch, attach", classes="read-only")

    def _keys(self) -> tuple | None:
        """Everything the composed keys are made of; None once the footer has no screen
        (its screen is being popped while a recompose was queued)."""
        try:
            bindings = self.screen.active_bindings
        except NoScreen:
            return None
        return (
            self.compact,
            self.show_command_palette,
            tuple(
                (binding.key, self.app.get_key_display(binding), binding.description, binding.show, enabled, tooltip)
                for _, binding, enabled, tooltip in bindings.values()
            ),
        )

    async def recompose(self) -> None:
        if not self.is_attached:
            return
        keys = self._keys()
        if keys is None:
            return
        # Until Textual says the bindings are ready its compose yields nothing: never
        # remember that empty footer as the keys' picture. Without the flag, always ready.
        if getattr(self, "_bindings_ready", True) is not True:
            return await super().recompose()
        if keys == self._shown:
            return
        self._shown = keys
        await super().recompose()
        self._drop_replaced_watchers()
        self._fit()

    def on_resize(self, event: events.Resize) -> None:
        self._fit()

    def _fit(self) -> None:
        width = self.size.width
        if not width:
            return
        needed = 0
        for child in self.children:
            key, description = (getattr(child, "key_display", None),
                                getattr(child, "description", None))
            if isinstance(key, str) and isinstance(description, str):
                # the full style pads the key a cell each side, the description one after
                needed += cell_len(key) + cell_len(description) + 3
            else:
                needed += child.outer_size.width
        self.compact = needed > width

    def _drop_replaced_watchers(self) -> None:
        """The replaced keys' data_bind watchers stay on this footer until `compact`
        changes (Textualize/textual#6666); drop them, as Textual's own check would."""
        try:
            watchers = getattr(self, "__watchers", {}).get("compact")
            if watchers:
                watchers[:] = [(node, callback) for node, callback in watchers if node.is_attached]
        except Exception:
            pass  # another Textual stores watchers otherwise: the leak returns, the app stays
