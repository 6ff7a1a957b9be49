"""The load bench (tests/tui/load_bench.py, same arguments) with more at every RSS sample,
to find what fills memory: each functools.lru_cache's size (found by scanning modules and
their classes: the app's gc.freeze() at mount hides those made at import from
gc.get_objects), the entries of Textual's LRUCache/FIFOCache instances, the live (not
frozen) gc-tracked objects by type, and glibc's mallinfo2 (the C heap: in use, free);
with --tracemalloc, tracebacks 5 frames deep and a snapshot dumped at every sample.
Written to $LOAD_PROBE_DIR/probe.jsonl (default /tmp/trackside-load-probe), one JSON row
per sample. Its own work is not subtracted from the bench's CPU and latency figures.

    .venv/bin/python tests/tui/load_probe.py --seconds 420 --json FILE

docs/load.md, "Memory levels off".
"""

import ctypes
import functools
import gc
import importlib.util
import json
import os
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
spec = importlib.util.spec_from_file_location("load_bench", REPO / "tests/tui/load_bench.py")
lb = importlib.util.module_from_spec(spec)
sys.modules["load_bench"] = lb
spec.loader.exec_module(lb)

OUT = Path(os.environ.get("LOAD_PROBE_DIR", "/tmp/trackside-load-probe"))


class MallInfo2(ctypes.Structure):
    _fields_ = [
        (n, ctypes.c_size_t)
        for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")
    ]


libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2

original = lb.Sampler.sample


def sample(self):
    original(self)
    import tracemalloc

    from textual.cache import FIFOCache, LRUCache

    row = {"t_s": self.samples[-1]["t_s"], "rss_mib": self.samples[-1]["rss_mib"]}
    mi = libc.mallinfo2()
    row["malloc"] = {k: round(getattr(mi, k) / 2**20, 2) for k in ("arena", "hblkhd", "uordblks", "fordblks", "keepcost")}
    live = gc.get_objects()
    row["types"] = dict(Counter(type(o).__qualname__ for o in live).most_common(60))
    row["n_objects"] = len(live)
    lrus = {}
    caches = Counter()
    cache_n = Counter()
    for o in live:
        if isinstance(o, (LRUCache, FIFOCache)):
            caches[type(o).__name__ + ":" + str(getattr(o, "_maxsize", getattr(o, "maxsize", "?")))] += len(o)
            cache_n[type(o).__name__ + ":" + str(getattr(o, "_maxsize", getattr(o, "maxsize", "?")))] += 1
    # lru_caches made at import are frozen by the app's gc.freeze(): not in get_objects; scan modules
    for mod in list(sys.modules.values()):
        for name, val in list(vars(mod).items()) if hasattr(mod, "__dict__") else ():
            found = [(name, val)]
            if isinstance(val, type) and val.__module__ == mod.__name__:
                found += [(f"{name}.{n}", getattr(v, "__func__", v)) for n, v in list(vars(val).items())]
            for label, f in found:
                if isinstance(f, functools._lru_cache_wrapper):
                    info = f.cache_info()
                    if info.currsize:
                        lrus[f"{mod.__name__}.{label}"] = [info.currsize, info.maxsize, info.hits, info.misses]
    row["lru"] = lrus
    row["textual_caches_entries"] = dict(caches)
    row["textual_caches_count"] = dict(cache_n)
    del live
    if tracemalloc.is_tracing():
        tracemalloc.take_snapshot().dump(str(OUT / f"snap-{int(row['t_s'])}.tm"))
    probe_log.write(json.dumps(row) + "\n")
    probe_log.flush()


if __name__ == "__main__":
    import tracemalloc

    OUT.mkdir(parents=True, exist_ok=True)
    probe_log = open(OUT / "probe.jsonl", "w")
    lb.Sampler.sample = sample

    if "--tracemalloc" in sys.argv:
        tracemalloc.start(5)  # the bench's start(1) is then a no-op: deeper tracebacks, to find owners
    lb.main()
