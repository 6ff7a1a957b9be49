"""Textual's Footer, rebuilt only when the keys it shows change.

Textual's Footer recomposes on every `refresh_bindings`, and the dashboard refreshes
bindings on every poll (a listing may enable or disable `k`). Each recompose replaced
~12 key widgets, and the replaced ones stayed alive through their `data_bind` watcher on
the footer (Textualize/textual#6666): 25 widgets a second, the app's largest memory leak.
"""

from __future__ import annotations

from textual.widgets import Footer as TextualFooter


class Footer(TextualFooter):
    _shown: tuple | None = None  # what the keys showed at the last recompose

    def _keys(self) -> tuple:
        """Everything the composed keys are made of."""
        return (
            self.compact,
            self.show_command_palette,
            tuple(
                (binding.key, self.app.get_key_display(binding), binding.description, binding.show, enabled, tooltip)
                for _, binding, enabled, tooltip in self.screen.active_bindings.values()
            ),
        )

    async def recompose(self) -> None:
        if not self._bindings_ready:
            return await super().recompose()
        keys = self._keys()
        if keys == self._shown:
            return
        self._shown = keys
        await super().recompose()
        # The replaced keys' data_bind watchers stay on this footer until `compact` changes
        # (Textualize/textual#6666); drop them, as Textual's own check would.
        watchers = getattr(self, "__watchers", {}).get("compact")
        if watchers:
            watchers[:] = [(node, callback) for node, callback in watchers if node.is_attached]
