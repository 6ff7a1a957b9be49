"""Bytecode for the trainer's imports, kept between launches where the image forbids it.

Some GPU images set PYTHONDONTWRITEBYTECODE=1 and ship torch without `__pycache__`: every
launch then compiles torch's Python from source, several seconds of a relaunch's start-up
(docs/benchmarks.md, "The first step at a new max_seq_len"). Before torch is imported, the
trainer has Python write its bytecode under a cache of its own instead, read by every later
launch. Where bytecode is allowed, nothing changes: the installed `__pycache__` is used.
"""
from __future__ import annotations

import os
import sys

CACHE_ENV = "TRACKSIDE_PYCACHE"  # where the bytecode goes (default ~/.cache/trackside/pycache)


def keep_bytecode(environ: dict | None = None) -> str | None:
    """Where bytecode is off by the environment, turn it on under the cache; the cache's
    path, or None where nothing was changed. Call before the heavy imports."""
    environ = os.environ if environ is None else environ
    if not sys.dont_write_bytecode or sys.pycache_prefix is not None:
        return None  # allowed already, or placed by the user (PYTHONPYCACHEPREFIX)
    cache = environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "trackside", "pycache")
    try:
        os.makedirs(cache, exist_ok=True)
    except OSError:
        return None  # nowhere to keep it: compiled from source, as before
    sys.pycache_prefix = cache
    sys.dont_write_bytecode = False
    return cache
