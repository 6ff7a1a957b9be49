"""A bound on Textual's cache of Rich styles' terminal escapes.

Textual caches every style's escapes (`Strip.render_ansi`, 16,384 entries). Each rendered
segment's style carries its screen offset (for text selection), so under a scrolling log
almost every style is new and the cache only fills (docs/load.md, round 3).
"""

from __future__ import annotations

from functools import lru_cache

from textual.strip import Strip

ESCAPE_CACHE = 1024


def bound_escape_cache(maxsize: int = ESCAPE_CACHE) -> None:
    """Shrink the cache to `maxsize`. A style keeps its own escapes once rendered
    (`Style._ansi`), so a smaller cache costs little. The cache is Textual's internal: a
    Textual that keeps it otherwise keeps its own size."""
    try:
        render_ansi = Strip.render_ansi.__func__
        if render_ansi.cache_parameters()["maxsize"] > maxsize:
            Strip.render_ansi = classmethod(lru_cache(maxsize)(render_ansi.__wrapped__))
    except Exception:
        return
