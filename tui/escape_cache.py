"""A bound on Textual's cache of Rich styles' terminal escapes.

Textual caches every style's escapes (16,384 entries). Each rendered segment's style
carries its screen offset (for text selection), so under a scrolling log almost every
style is new and the cache only fills (docs/load.md, "What holds the figures").
"""

from __future__ import annotations

from tui.textual_compat import shrink_escape_cache

ESCAPE_CACHE = 1024


def bound_escape_cache(maxsize: int = ESCAPE_CACHE) -> None:
    """Shrink the cache to `maxsize`. A style keeps its own escapes once rendered
    (`Style._ansi`), so a smaller cache costs little."""
    shrink_escape_cache(maxsize)
