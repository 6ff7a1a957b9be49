"""Load on the dashboard's UI side: 8 hosts × 8 GPUs polled at 1 Hz and one run printing
2,000 console lines/s (posted as the monitors post them: a batch every 100 ms), while
keys are pressed. Reports key-to-repaint latency, the app's CPU time and memory growth.

    .venv/bin/python tests/tui/load_bench.py [seconds]

Not collected by pytest (the machine's other load makes timings noisy); the numbers go
in docs/benchmarks.md.
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from backends.hosts import LocalHost  # noqa: E402
from tests.tui.sample import NOW, gpus, metrics_events, run_info  # noqa: E402
from tui.app import TracksideApp, Watched  # noqa: E402
from tui.messages import ConsoleBatch, GpusPolled, MetricsBatch, RunsListed  # noqa: E402

HOSTS = [f"gpu{i}" for i in range(8)]
LINES_PER_S = 2000


def rss_mib() -> float:
    """Resident memory now (not the peak): flat over a run means bounded buffers."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def bench(seconds: float) -> dict:
    app = TracksideApp([Watched(LocalHost(name)) for name in HOSTS], monitor=False, clock=lambda: NOW)
    latencies: list[float] = []
    baseline: list[float] = []
    async with app.run_test(size=(160, 48)) as pilot:
        info = run_info()
        for name in HOSTS:
            app.post_message(RunsListed(name, [info], NOW))
        key = f"{HOSTS[0]}/{info.run_id}"
        app.post_message(MetricsBatch(HOSTS[0], key, metrics_events(2000), 0))
        await pilot.pause()
        app.open_run(key)
        await pilot.pause()

        gc.collect()
        rss_start = rss_mib()
        cpu_start, wall_start = time.process_time(), time.monotonic()
        line = 0
        next_poll = wall_start
        while time.monotonic() - wall_start < seconds:
            now = time.monotonic()
            if now >= next_poll:
                for name in HOSTS:
                    app.post_message(GpusPolled(name, gpus(300.0), NOW))
                next_poll += 1.0
            batch = [f"step {line + i} loss={1.5 - (line + i) * 1e-6:.6f} lr=3e-4" for i in range(LINES_PER_S // 10)]
            line += len(batch)
            app.post_message(ConsoleBatch(HOSTS[0], key, batch))
            if line % 2000 == 0:
                # The pilot's own cost (an unbound key) is measured alongside and subtracted.
                pressed = time.perf_counter()
                await pilot.press("x")
                baseline.append((time.perf_counter() - pressed) * 1000)
                pressed = time.perf_counter()
                await pilot.press("y")  # toggles the chart's scale: a full replot and repaint
                await pilot.pause()
                latencies.append((time.perf_counter() - pressed) * 1000)
            await asyncio.sleep(max(0.0, 0.1 - (time.monotonic() - now)))
        cpu = time.process_time() - cpu_start
        wall = time.monotonic() - wall_start
        gc.collect()
        rss_end = rss_mib()
    latencies.sort()
    return {
        "seconds": round(wall, 1),
        "lines": line,
        "pilot_press_ms_p50": round(statistics.median(baseline), 1),
        "key_to_repaint_ms_p50": round(statistics.median(latencies), 1),
        "key_to_repaint_ms_p99": round(latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 1),
        "cpu_pct_of_a_core": round(100 * cpu / wall, 1),
        "cpu_pct_per_host": round(100 * cpu / wall / len(HOSTS), 2),
        "rss_start_mib": round(rss_start, 1),
        "rss_end_mib": round(rss_end, 1),
    }


if __name__ == "__main__":
    print(asyncio.run(bench(float(sys.argv[1]) if len(sys.argv) > 1 else 30.0)))
