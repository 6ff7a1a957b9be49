"""Textual's Footer, rebuilt only when the keys it shows change.

Textual's Footer recomposes on every `refresh_bindings`, and the dashboard refreshes
bindings on every poll (a listing may enable or disable `k`). Each recompose replaced
~12 key widgets, and the replaced ones stayed alive through their `data_bind` watcher on
the footer (Textualize/textual#6666): 25 widgets a second, the app's largest memory leak.

Both workarounds read Textual internals (`_bindings_ready`, the `__watchers` store);
each is written so that a Textual without them loses the workaround, not the footer.
"""

from __future__ import annotations

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

    def _drop_replaced_watchers(self) -> None:
        """The replaced keys' data_bind watchers stay on this footer until `compact`
        changes (Textualize/textual#6666); drop them, as Textual's own check would."""
        try:
            watchers = getattr(self, "__watchers", {}).get("compact")
            if watchers:
                watchers[:] = [(node, callback) for node, callback in watchers if node.is_attached]
        except Exception:
            pass  # another Textual stores watchers otherwise: the leak returns, the app stays
