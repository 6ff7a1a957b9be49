"""The dashboard under load, end to end: 8 hosts × 8 GPUs polled at 1 Hz over SSH and a
run writing 2,000 console lines/s, while keys are pressed. Reports key-to-repaint
latency, the app's CPU time, lines and polls achieved, and memory over time.

    .venv/bin/python tests/tui/load_bench.py [--seconds 600] [--tracemalloc] [--json FILE]

The setup is real except the GPUs: the test sshd (tests/sshd.py) serves eight SSHHost
entries (distinct names, runs roots and tmux servers, one address), each reading
tests/fake_nvidia_smi.py with FAKE_NVIDIA_SMI_GPUS=8 through a wrapper script; a line
generator (this file's `generate` subcommand) is launched on the first host through
backends.runs.launch as the host's train command, so it runs in tmux with a run dir the
app follows like any run; the real TracksideApp runs headless (App.run_test) on that
run's screen.

Key-to-repaint: a key event is sent through the driver, as a terminal's input thread
sends it, and the latency is the time from that send to the end of the first screen
update that contains the loss chart re-rendered after the key's action (`y` and `s`
both replot it). The headless driver skips turning an update into terminal escapes, so
the bench does that conversion itself (and discards the text): a terminal's cost is
counted, only the write is not. Probes are a few attribute writes per frame, so no
baseline is subtracted. CPU: getrusage of this process (the app, its pilot and its
worker threads) over the measured window, less the bench's own sampling; sshd, the
fake nvidia-smi and the generator are other processes. --tracemalloc adds allocation
tracing (which slows every allocation: use it to find growth, not for CPU or latency).

Not collected by pytest: it takes minutes and its timings depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import random
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HOSTS = 8
LINES_PER_S = 2000
STEPS_PER_S = 10
HISTORY_STEPS = 5000  # written before the run "starts": the loss chart's buffer is full from the first second
SAMPLE_S = 30.0
WARMUP_S = 20.0


# --- the line generator (runs in tmux on the "remote" host; stdlib only) ----------------


def step_event(step: int, now: float) -> dict:
    ttt = [1.2 + 0.9 * 2.718 ** (-step / 3000) + 0.2 * k + 0.03 * ((step * 7919) % 13) / 13 for k in range(3)]
    return {
        "event": "step", "time": now, "step": step, "epoch": step // 4120, "loss": sum(ttt) / 3,
        "loss_ttt": ttt, "acc_ttt": [0.45, 0.31, 0.22], "lr": 3e-4, "grad_norm": 1.07,
        "tokens": 61440, "tokens_per_s": 20480.0, "samples_per_row": 1.9, "pad_frac": 0.04, "peak_mem_gib": 41.3,
    }  # fmt: skip


def console_line(n: int) -> str:
    if n % 50 == 0:
        return f"extract shard {n // 50 % 64}: {n % 1000 / 10:5.1f}%|{'#' * (n % 10)}{' ' * (10 - n % 10)}| {n % 1000}/1000 [00:{n % 60:02d}<00:10, 98.1it/s]"
    return f"[rank{n % 8}] it {n} loss={1.2 + (n % 97) / 97:.4f} lr=3.0e-04 grad_norm=1.07 tok/s=20480 pad=0.04 mem=41.3GiB"


def generate(argv: list[str]) -> None:
    """Append LINES_PER_S lines/s to console.log and STEPS_PER_S step events/s to
    metrics.jsonl in --out, after a history of HISTORY_STEPS steps, until killed."""
    parser = argparse.ArgumentParser(prog="load_bench.py generate")
    parser.add_argument("--out", required=True)
    parser.add_argument("--lines-per-s", type=int, default=LINES_PER_S)
    parser.add_argument("--steps-per-s", type=int, default=STEPS_PER_S)
    args, _ = parser.parse_known_args(argv)  # the launch adds the run's params as flags
    out = Path(args.out)
    started = time.time()
    with open(out / "metrics.jsonl", "a") as metrics, open(out / "console.log", "a") as console:
        metrics.write(json.dumps({"event": "start", "time": started, "config": {"steps": 10**6, "ttt_steps": 3}, "steps_per_epoch": 4120}) + "\n")
        metrics.writelines(json.dumps(step_event(s, started - HISTORY_STEPS + s)) + "\n" for s in range(HISTORY_STEPS))
        metrics.flush()
        lines = steps = 0
        clock0 = time.monotonic()
        while True:
            elapsed = time.monotonic() - clock0
            due = int(elapsed * args.lines_per_s)
            if due > lines:
                console.write("".join(console_line(n) + "\n" for n in range(lines, due)))
                console.flush()
                lines = due
            due = int(elapsed * args.steps_per_s)
            if due > steps:
                metrics.write("".join(json.dumps(step_event(HISTORY_STEPS + s, time.time())) + "\n" for s in range(steps, due)))
                metrics.flush()
                steps = due
            time.sleep(0.01)


# --- the bench ---------------------------------------------------------------------------


def rss_mib() -> float:
    """Resident memory now (not the peak): flat over a run means bounded buffers."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def phase_medians(phases: list[dict]) -> dict:
    return {name: round(statistics.median(p[name] for p in phases) * 1000, 1) for name in phases[0]} if phases else {}


def make_app_class():
    from textual import events

    from tui.app import TracksideApp

    class LoadedApp(TracksideApp):
        """The real app plus counters and the key-to-repaint probe.

        Handlers defined here run before the app's own (Textual calls every class's
        handler along the MRO), so they only count."""

        CSS_PATH = str(REPO / "tui" / TracksideApp.CSS_PATH)  # relative paths resolve from the subclass's file

        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.polls = 0
            self.lines_in = 0
            self.steps_in = 0
            self.key_sent: float | None = None  # perf_counter of the key being measured
            self.chart_rendered = False  # the chart rendered since that key's action
            self.painted = asyncio.Event()
            self.latency = 0.0
            self.marks: dict[str, float] = {}
            self.phases: list[dict] = []

        def on_gpus_polled(self, message) -> None:
            self.polls += 1

        def on_console_batch(self, message) -> None:
            self.lines_in += len(message.lines)

        def on_metrics_batch(self, message) -> None:
            self.steps_in += sum(e.get("event") == "step" for e in message.events)

        def _display(self, screen, renderable) -> None:
            if renderable is not None and not self._batch_count:
                renderable.render_segments(self.console)  # what a terminal driver would write
            super()._display(screen, renderable)
            if renderable is not None and self.key_sent is not None and self.chart_rendered:
                self.marks["painted"] = time.perf_counter()
                self.latency = self.marks["painted"] - self.key_sent
                # Where the time went: waiting for the loop, the key's action, waiting for the
                # frame, the chart's render, and the rest of the frame (other widgets, escapes).
                m, sent = self.marks, self.key_sent
                self.phases.append(
                    {"queued": m["action"] - sent, "replot": m["replotted"] - m["action"],
                     "to_frame": m["render"] - m["replotted"], "chart_render": m["rendered"] - m["render"],
                     "rest_of_frame": m["painted"] - m["rendered"],
                     # of the whole, the time the app's thread spent on a CPU (any work, not only this key's)
                     "app_on_cpu": time.thread_time() - m["cpu"]}
                )  # fmt: skip
                self.key_sent = None
                self.painted.set()

        def send_key(self, key: str) -> None:
            self.chart_rendered = False
            self.painted.clear()
            self.marks = {"cpu": time.thread_time()}
            self.key_sent = time.perf_counter()
            self._driver.send_message(events.Key(key, key))

    return LoadedApp


def probe_chart(app, chart) -> None:
    """Mark renders of the chart that follow the measured key's action."""
    replot, render = chart.replot, chart.render
    acted = False

    def probed_replot() -> None:
        nonlocal acted
        acted = app.key_sent is not None
        if acted:
            app.marks["action"] = time.perf_counter()
        replot()
        if acted:
            app.marks["replotted"] = time.perf_counter()

    def probed_render():
        if not (acted and app.key_sent is not None):
            return render()
        app.marks["render"] = time.perf_counter()
        try:
            return render()
        finally:
            app.chart_rendered = True
            app.marks["rendered"] = time.perf_counter()

    chart.replot, chart.render = probed_replot, probed_render


class Sampler:
    """RSS (and with tracemalloc, the top growth and live Strips) every SAMPLE_S."""

    def __init__(self, trace: bool, start: float) -> None:
        self.trace = trace
        self.start = start
        self.samples: list[dict] = []
        self.cost_s = 0.0  # CPU the sampling itself took, left out of the app's
        self.first = None

    def sample(self) -> None:
        began = time.thread_time()
        row = {"t_s": round(time.monotonic() - self.start, 1), "rss_mib": round(rss_mib(), 1)}
        if self.trace:
            import tracemalloc

            from textual.strip import Strip
            from textual.widget import Widget

            gc.collect()  # count what is reachable, not garbage awaiting a collection
            live = gc.get_objects()
            row["strips"] = sum(isinstance(o, Strip) for o in live)
            widgets = Counter(type(o).__name__ for o in live if isinstance(o, Widget))
            row["widgets"] = dict(widgets.most_common(6))
            del live
            snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
            row["traced_mib"] = round(sum(s.size for s in snapshot.statistics("filename")) / 2**20, 1)
            if self.first is None:
                self.first = snapshot
            else:
                row["top_growth"] = [
                    f"{s.traceback[0].filename.rsplit('site-packages/', 1)[-1]}:{s.traceback[0].lineno} {s.size_diff / 1024:+.0f} KiB"
                    for s in snapshot.compare_to(self.first, "lineno")[:6]
                ]
        self.samples.append(row)
        print(json.dumps(row), flush=True)
        self.cost_s += time.thread_time() - began


async def wait_until(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := condition():
            return value
        await asyncio.sleep(0.1)
    raise SystemExit(f"load bench: timed out after {timeout:.0f}s waiting for {what}")


async def bench(seconds: float, trace: bool, gc_freeze: bool) -> dict:
    from backends import runs
    from scripts.local_box import write_smi_wrapper
    from tests.sshd import Sshd, sshd_available
    from tui.app import Watched
    from tui.screens.run import RunScreen
    from tui.widgets.loss_chart import LossChart

    if not sshd_available():
        raise SystemExit("load bench: needs OpenSSH's sshd (/usr/sbin/sshd)")
    if trace:
        import tracemalloc

        # From the start, so that objects replaced during the window (the step history
        # turning over) count as freed, not as new: growth then means growth.
        tracemalloc.start(1)
    tmp = Path(tempfile.mkdtemp(prefix="trackside-load-"))
    sshd = Sshd(tmp / "sshd")
    sshd.start()
    # The hosts' side (sshd, the fake nvidia-smi, tmux, the generator: all children of
    # sshd) would run on eight other machines; niced, it competes less with the app for
    # this one's cores, as it would not compete at all in a real fleet.
    os.setpriority(os.PRIO_PROCESS, sshd._proc.pid, 10)
    smi = write_smi_wrapper(tmp)
    tag = uuid.uuid4().hex[:6]
    hosts = []
    for i in range(HOSTS):
        (tmp / f"runs{i}").mkdir()
        host = sshd.host(f"gpu{i}", runs_root=str(tmp / f"runs{i}"))
        host.tmux_socket = f"trackside-load-{tag}-{i}"
        hosts.append(host)
    info = None
    try:
        generator = [sys.executable, str(Path(__file__).resolve()), "generate"]
        info = await runs.launch(hosts[0], ["trackside", "train"], session="load", params={}, train_command=generator)
        app = make_app_class()([Watched(h, smi=smi) for h in hosts])
        async with app.run_test(size=(200, 50)):
            key = f"{hosts[0].name}/{info.run_id}"
            await wait_until(lambda: key in app.runs, 30, "the run listing")
            app.open_run(key)
            screen = await wait_until(lambda: isinstance(app.screen, RunScreen) and app.screen.is_mounted and app.screen, 10, "the run screen")
            await wait_until(lambda: screen.composed, 10, "the run screen to compose")
            probe_chart(app, screen.query_one(LossChart))
            await wait_until(lambda: len(app.runs[key].steps) >= HISTORY_STEPS, 60, "the run's step history")
            await asyncio.sleep(WARMUP_S)
            if gc_freeze:
                gc.freeze()  # on top of the app's own at mount: the history and screens made since leave the passes too

            gc.collect()
            start = time.monotonic()
            sampler = Sampler(trace, start)
            sampler.sample()
            full_gcs: list[float] = []  # durations of the collector's full (generation 2) passes
            gc_started = 0.0

            def on_gc(phase: str, info: dict) -> None:
                nonlocal gc_started
                if info["generation"] == 2:
                    if phase == "start":
                        gc_started = time.perf_counter()
                    else:
                        full_gcs.append(time.perf_counter() - gc_started)

            gc.callbacks.append(on_gc)
            cpu0, polls0, lines0, steps0 = cpu_s(), app.polls, app.lines_in, app.steps_in
            latencies: list[float] = []
            missed = 0
            next_sample = start + SAMPLE_S
            keys = ["y", "s"]
            while (now := time.monotonic()) - start < seconds:
                if now >= next_sample:
                    sampler.sample()
                    next_sample += SAMPLE_S
                app.send_key(keys[len(latencies) % 2])
                try:
                    await asyncio.wait_for(app.painted.wait(), 5.0)
                    latencies.append(app.latency * 1000)
                except asyncio.TimeoutError:
                    missed += 1
                    app.key_sent = None
                await asyncio.sleep(random.uniform(0.5, 1.5))
            wall = time.monotonic() - start
            cpu = cpu_s() - cpu0 - sampler.cost_s
            gc.callbacks.remove(on_gc)
            sampler.sample()
            polls, lines, steps = app.polls - polls0, app.lines_in - lines0, app.steps_in - steps0
            run_log = len(app.runs[key].log)
        written = sum(1 for _ in open(Path(info.run_dir) / "console.log", "rb"))
    finally:
        if info is not None:
            # The pane's process group: the launch's wrapper shell traps SIGHUP, so killing
            # tmux leaves the generator writing 2,000 lines/s into the deleted run dir,
            # competing with every later run for this machine's cores.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(info.pids[0], signal.SIGKILL)
        for host in hosts:
            subprocess.run(["tmux", "-L", host.tmux_socket, "kill-server"], capture_output=True)
            await host.close()
        sshd.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return {
        "seconds": round(wall, 1),
        "keys": len(latencies),
        "keys_without_repaint": missed,
        "key_to_repaint_ms": {q: round(percentile(latencies, p), 1) for q, p in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))}
        | {"max": round(max(latencies), 1)},
        "app_cpu_s": round(cpu, 1),
        "app_cpu_pct_of_a_core": round(100 * cpu / wall, 1),
        "app_cpu_pct_per_host": round(100 * cpu / wall / HOSTS, 2),
        "lines_per_s_to_app": round(lines / wall),
        "console_lines_written": written,
        "steps_per_s_to_app": round(steps / wall, 1),
        "gpu_polls_per_s": round(polls / wall, 2),
        "gpu_polls_per_host_s": round(polls / wall / HOSTS, 3),
        "run_log_lines_kept": run_log,
        "rss_mib_by_minute": {f"{s['t_s'] / 60:.1f}": s["rss_mib"] for s in sampler.samples},
        "load_average": os.getloadavg(),
        "samples": sampler.samples,
        "trace": trace,
        "gc_freeze": gc_freeze,
        "latency_ms_mean": round(statistics.fmean(latencies), 1),
        "full_gc_per_min": round(len(full_gcs) * 60 / wall, 1),
        "full_gc_ms": {"p50": round(statistics.median(full_gcs) * 1000, 1), "max": round(max(full_gcs) * 1000, 1)} if full_gcs else {},
        # Each phase's median, and the phases of the slowest 5 % of keys (their medians).
        "phases_ms_p50": phase_medians(app.phases),
        "phases_ms_slowest_5pct": phase_medians(sorted(app.phases, key=lambda p: p["queued"] + p["replot"] + p["to_frame"] + p["chart_render"] + p["rest_of_frame"])[-max(1, len(app.phases) // 20) :]),
    }


def main() -> None:
    if sys.argv[1:2] == ["generate"]:
        generate(sys.argv[2:])
        return
    sys.path.insert(0, str(REPO))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="measured time, after a warm-up")
    parser.add_argument("--tracemalloc", action="store_true", help="trace allocations (slows the app: growth only)")
    parser.add_argument("--gc-freeze", action="store_true", help="gc.freeze() again after the warm-up (the app freezes what its start-up made; this also freezes the run's history and screens)")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    result = asyncio.run(bench(args.seconds, args.tracemalloc, args.gc_freeze))
    summary = {k: v for k, v in result.items() if k != "samples"}
    print(json.dumps(summary, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
