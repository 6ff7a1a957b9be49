"""The dashboard supervising a real training run on this machine's GPU, end to end (issues 6, 22).

The real app runs headless (Textual Pilot) on LocalHost, with real tmux (a private server)
and real NVML. It launches a drafter run, waits until the run screen shows real power,
memory and a loss curve, checks the app's reading against NVML and nvidia-smi read at the
same moment, presses k + y and checks the release, edits the run (e), relaunches (r),
watches the new run train and kills it too. It prints a Markdown report and writes it,
the raw figures and SVG screenshots to $OUT (else screenshots/; for --smoke, a new
temporary directory).

Two drafters (--drafter): EAGLE-3 (the default), a Llama-3.1-8B-shaped drafter whose TTT
steps and max_seq_len are edited; DFlash, a Qwen3-8B-shaped drafter on random data made
here, whose chart (loss per block position, τ) must show, and whose max_anchors is edited:
the edit form must show the memory model's predicted peak for the new value and the
largest max_anchors that fits, and the relaunched run must train with it. A DFlash run's
files are named dflash-*.svg and gpu_e2e-dflash.{md,json}, so both drafters' fit in one $OUT.

    PYTHONPATH=$PWD python3 scripts/gpu_e2e.py                    # on a machine with an NVIDIA GPU
    PYTHONPATH=$PWD python3 scripts/gpu_e2e.py --drafter dflash
    .venv/bin/python scripts/gpu_e2e.py --smoke [--drafter dflash]  # the same flow on CPU, tiny drafter

Every wait is bounded, the flow stops within its mode's budget (380 s for EAGLE-3, 285 s for
DFlash, data included) and a watchdog ends the process 15 s after; whatever the script
started (the tmux server, the trainers) is ended on the way out, and a killed run's
checkpoint (saved on SIGTERM: 12 GB for the DFlash drafter) is deleted once the kill is
checked. Exit status 0 when every check passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from backends.hosts import LocalHost  # noqa: E402
from training.params import PARAMS  # noqa: E402
from tui.app import Demo, TracksideApp, Watched  # noqa: E402
from tui.curves import positions_shown  # noqa: E402
from tui.screens.edit import EditScreen, gpu_total_gib  # noqa: E402
from tui.screens.kill import KillConfirm, KillReportScreen  # noqa: E402
from tui.screens.run import RunScreen  # noqa: E402
from tui.state import DFLASH_KNOBS  # noqa: E402
from tui.widgets.loss_chart import LossChart  # noqa: E402

SIZE = (160, 48)
TMUX_SOCKET = "trackside-gpu-e2e"
SESSION = "gpu-e2e"
DATA_DIR = "/tmp/data-8b"
DFLASH_DATA_DIR = "/tmp/data-qwen3-8b-dflash"
RELAUNCH_TTT = 5
POWER_TOLERANCE = 0.05  # power moves step to step; memory barely does
MEMORY_TOLERANCE = 0.01
IDLE_TOLERANCE_MIB = 100  # "back to idle": within this of the memory used before launch
AGREEMENT_SAMPLES = 3
WATCHDOG_AFTER_S = 15  # past its budget the process ends itself, even if a call blocks
SMI_QUERY = ["nvidia-smi", "--query-gpu=power.draw,memory.used", "--format=csv,noheader,nounits", "--id=0"]
DRAFTER_NAMES = {"eagle3": "EAGLE-3", "dflash": "DFlash"}


@dataclass(frozen=True)
class Mode:
    name: str  # gpu or smoke
    drafter: str  # eagle3 or dflash
    preset: str
    data: tuple[str, ...]  # the trainer's flags choosing its data
    device: str
    params: dict  # the first run's params, as flags on its argv (EAGLE-3: max_seq_len, ttt_steps)
    min_power_w: float | None  # the run screen must show more than this before the checks
    min_mem_gib: float | None
    loss_points: int
    card_gib: float | None  # the card size handed to `fit` when NVML reads none (CPU smoke)
    # A short schedule on the GPU, so warm-up ends and the loss falls visibly on screen.
    schedule: tuple[str, ...] = ("--steps", "100000")
    length_cap: int | None = None  # EAGLE-3's relaunch max_seq_len: the largest that fits, at most this
    relaunch: dict | None = None  # DFlash's edit, as it stands
    budget_s: float = 380.0  # the whole flow, data included
    data_dir: str | None = None  # made before the flow (and reused) when it lacks a dataset.json

    @property
    def dflash(self) -> bool:
        return self.drafter == "dflash"

    @property
    def prefix(self) -> str:
        """Of its files: an EAGLE-3 run's keep the names they always had."""
        return "dflash-" if self.dflash else ""

    def train_argv(self) -> list[str]:
        # Not installed as a package on the GPU box: the trainer is this Python's module.
        drafter = ["--drafter", self.drafter] if self.dflash else []
        flags = [part for name, value in self.params.items() for part in (PARAMS[name].flag, str(value))]
        return [
            sys.executable, "-m", "training", "train", *drafter, *self.data, "--preset", self.preset,
            "--device", self.device, *flags, *self.schedule, "--save-every", "0",
        ]  # fmt: skip


# 3000 steps: the flow stops the run itself; at 8192 x 3 the trainer now finishes 300 steps
# (~40 s) before the screen has gathered its 40 loss points.
GPU = Mode("gpu", "eagle3", "llama3-8b", ("--data", DATA_DIR), "cuda", {"max_seq_len": 8192, "ttt_steps": 3},
           300.0, 10.0, 40, None, ("--steps", "3000", "--lr", "1e-3"), length_cap=16384,
           data_dir=DATA_DIR)  # fmt: skip
SMOKE = Mode("smoke", "eagle3", "tiny", ("--synthetic",), "cpu", {"max_seq_len": 256, "ttt_steps": 2},
             None, None, 5, 4.0, length_cap=512)  # fmt: skip
# Qwen3-8B's shape at 8K tokens, 512 anchors of 16 (26 GiB, ~0.2 s a step on an H200, its
# first ~47 s: docs/benchmarks-archive.md, "DFlash on the H200 against speculators"), then
# 1,024 anchors: twice the block positions. 200 W: well above the idle card's 80-125 W,
# below the 500 W an EAGLE-3 step draws, should the loader (48 KiB of hidden states a
# token) keep the card waiting. lr 3e-4: at the 40th step of the warm-up, the 1e-4 at
# which the benchmark's loss fell. 285 s: data ~20 s, launch to 40 points ~60 s, two kills
# each saving a 12 GB checkpoint, the relaunch's first step; the flow and its watchdog end
# within 5 minutes.
DFLASH_GPU = Mode("gpu", "dflash", "qwen3-8b", ("--data", DFLASH_DATA_DIR), "cuda",
                  {"max_seq_len": 8192, "max_anchors": 512}, 200.0, 10.0, 40, None,
                  ("--steps", "3000", "--lr", "3e-4"), relaunch={"max_anchors": 1024}, budget_s=285.0,
                  data_dir=DFLASH_DATA_DIR)  # fmt: skip
DFLASH_SMOKE = Mode("smoke", "dflash", "tiny", ("--synthetic",), "cpu", {"max_seq_len": 256, "max_anchors": 16},
                    None, None, 5, 4.0, relaunch={"max_anchors": 32})  # fmt: skip
MODES = {("gpu", "eagle3"): GPU, ("smoke", "eagle3"): SMOKE, ("gpu", "dflash"): DFLASH_GPU,
         ("smoke", "dflash"): DFLASH_SMOKE}  # fmt: skip


class Stuck(Exception):
    """A bounded wait ran out, or the flow saw something it must not."""


@dataclass
class Reading:
    source: str
    power_w: float | None
    mem_mib: float | None
    time: float  # epoch seconds the figures were read at
    total_mib: float | None = None


class Nvml:
    """GPU 0 read straight through pynvml: the reference the app's reading is checked against."""

    def __init__(self) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nv, self.handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
            name = pynvml.nvmlDeviceGetName(self.handle)  # bytes from older pynvml
            self.name = name.decode() if isinstance(name, bytes) else name
        except Exception as error:  # no library, no driver, no device: the CPU smoke
            self.nv, self.handle, self.name = None, None, f"no NVML ({type(error).__name__}: {error})"

    def read(self) -> Reading | None:
        if self.nv is None:
            return None
        nv = self.nv
        try:  # the same memory query the app makes (v2: "used" without the driver's reserve)
            memory = nv.nvmlDeviceGetMemoryInfo(self.handle, version=nv.nvmlMemory_v2)
        except (AttributeError, TypeError, nv.NVMLError):
            memory = nv.nvmlDeviceGetMemoryInfo(self.handle)
        power = nv.nvmlDeviceGetPowerUsage(self.handle) / 1000
        return Reading("NVML", power, memory.used / 2**20, time.time(), memory.total / 2**20)

    def compute_pids(self) -> list[int]:
        if self.nv is None:
            return []
        return [p.pid for p in self.nv.nvmlDeviceGetComputeRunningProcesses(self.handle)]


def start_smi() -> subprocess.Popen | None:
    try:
        return subprocess.Popen(SMI_QUERY, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except FileNotFoundError:
        return None


def finish_smi(process: subprocess.Popen | None, started: float) -> Reading | None:
    """nvidia-smi's answer, timed at the middle of its run."""
    if process is None:
        return None
    try:
        out, _ = process.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        return None
    middle = (started + time.time()) / 2
    try:
        power, memory = (float(v) for v in out.strip().splitlines()[0].split(","))
    except (ValueError, IndexError):
        return None
    return Reading("nvidia-smi", power, memory, middle)


def read_smi() -> Reading | None:
    return finish_smi(start_smi(), time.time())


def app_reading(app) -> Reading | None:
    snapshot = app.hosts["local"].gpus
    gpus = getattr(snapshot, "gpus", None)
    if not gpus:
        return None
    gpu = gpus[0]
    return Reading(f"app ({snapshot.source})", gpu.power_w, gpu.mem_used_mib, snapshot.time, gpu.mem_total_mib)


def screen_text(app) -> str:
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


def panel_figures(app) -> str:
    """GPU 0's figures as the run screen's panel prints them, e.g. `612/700 W  20.1/140.4 GiB`."""
    match = re.search(r"GPU0 .*?(\d+/\d+ W).*?([\d.]+/[\d.]+ GiB)", screen_text(app))
    return f"{match[1]}  {match[2]}" if match else "—"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def start_ticks(pid: int) -> str | None:
    """The process's start time (/proc/PID/stat field 22), or None when it is gone or a
    zombie: with the pid it names one process, so a reused pid never reads as a survivor."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else fields[19]


def still_running(pid: int, started: str | None) -> bool:
    """`os.kill(pid, 0)` succeeds, and it is the same process, not a zombie awaiting its reaper."""
    return pid_alive(pid) and started is not None and start_ticks(pid) == started


def off_by(value: float | None, reference: float | None) -> float | None:
    if value is None or reference is None or reference == 0:
        return None
    return abs(value - reference) / abs(reference)


class Flow:
    """The operator's session, step by step; `facts` collects what a report needs."""

    def __init__(self, mode: Mode, out: Path, runs_root: Path) -> None:
        self.mode = mode
        self.out = out
        self.runs_root = runs_root
        self.nvml = Nvml()
        self.facts: dict = {"mode": mode.name, "drafter": mode.drafter, "gpu": self.nvml.name, "screenshots": [],
                            "checks": []}  # fmt: skip
        self.app: TracksideApp | None = None
        self.pilot = None
        self.waiting = "nothing yet"  # str, or a callable saying what was seen instead

    def waiting_for(self) -> str:
        return self.waiting() if callable(self.waiting) else self.waiting

    async def until(self, condition, timeout: float, what, poll: float = 0.1):
        """Let the app run until condition() is true; Stuck, naming what never happened."""
        self.waiting = what
        value = await self.eventually(condition, timeout, poll)
        if not value:
            raise Stuck(f"timed out after {timeout:.0f}s waiting for {self.waiting_for()}")
        return value

    async def showing(self, kind: type, timeout: float, what: str):
        """The screen on top once it is a `kind`."""
        return await self.until(lambda: isinstance(self.app.screen, kind) and self.app.screen, timeout, what)

    def check(self, what: str, ok: bool, detail: str = "") -> None:
        self.facts["checks"].append({"what": what, "ok": bool(ok), "detail": detail})

    async def eventually(self, condition, timeout: float, poll: float = 0.1):
        """condition()'s first true value within timeout, the app running meanwhile, else
        None: alone, for a check that fails plainly rather than stopping the flow."""
        deadline = time.monotonic() + timeout
        while not (value := condition()):
            if time.monotonic() >= deadline:
                return None
            await self.pilot.pause(poll)
        return value

    async def save(self, name: str) -> None:
        """An SVG screenshot of the screen on top, once it has drawn (a screen just pushed
        can be saved before its first layout: a blank picture)."""
        await self.pilot.pause()
        await self.eventually(lambda: screen_text(self.app).strip(), 5)
        path = Path(self.app.save_screenshot(f"{self.mode.prefix}{name}.svg", str(self.out)))
        self.facts["screenshots"].append(path.name)

    def idle(self, label: str) -> None:
        self.facts[label] = {r.source: asdict(r) for r in (self.nvml.read(), read_smi()) if r is not None}

    async def settle(self, label: str) -> None:
        """Idle readings after a kill, once NVML reads the idle level again (at most 5 s):
        the report's release is per process, the card's total may trail it."""
        before, waited = self.facts["idle_before"].get("NVML"), time.monotonic()
        while before and time.monotonic() - waited < 5:
            reading = self.nvml.read()
            if reading.mem_mib - before["mem_mib"] <= IDLE_TOLERANCE_MIB:
                break
            await self.pilot.pause(0.1)
        self.idle(label)
        self.facts[f"{label}_waited_s"] = round(time.monotonic() - waited, 2)

    def relaunch_changes(self) -> dict:
        """The edit the flow makes before relaunching: EAGLE-3's TTT steps and the longest
        max_seq_len the memory model fits (capped), DFlash's max_anchors (the mode's)."""
        if self.mode.dflash:
            return dict(self.mode.relaunch)
        return {"max_seq_len": self.relaunch_length(), "ttt_steps": RELAUNCH_TTT}

    def relaunch_length(self) -> int:
        from training.drafters.eagle3 import memory
        from training.config import PRESETS

        reading = self.nvml.read()
        card = reading.total_mib / 1024 if reading else self.mode.card_gib
        largest = memory.largest_fitting(PRESETS[self.mode.preset], RELAUNCH_TTT, card)
        chosen = min(largest, self.mode.length_cap)
        where = "the card's total from NVML" if reading else "a nominal card (no GPU here)"
        self.facts["relaunch_length"] = {
            "card_gib": round(card, 1), "largest_fitting": largest, "cap": self.mode.length_cap, "chosen": chosen,
            "why": f"training.drafters.eagle3.memory.largest_fitting({self.mode.preset}, ttt_steps={RELAUNCH_TTT}, "
                   f"gpu_mem_gib={card:.1f}, {where}; uncalibrated) = {largest}, capped at "
                   f"{self.mode.length_cap} to keep each step short",
        }  # fmt: skip
        return chosen

    async def run(self) -> None:
        mode = self.mode
        self.idle("idle_before")
        changes = self.relaunch_changes()
        host = LocalHost("local", runs_root=str(self.runs_root))
        host.tmux_socket = TMUX_SOCKET  # backends.tmux reads this attribute
        self.app = app = TracksideApp([Watched(host)], demo=Demo(mode.train_argv(), SESSION, dict(mode.params)))
        async with app.run_test(size=SIZE) as pilot:
            self.pilot = pilot
            screen = await self.showing(RunScreen, 15, "the run screen")
            launched = time.monotonic()
            first = await self.until(lambda: screen.run, 60, "the run to launch")
            self.facts["first_run"] = {"key": first.key, "params": dict(mode.params)}
            await self.until(lambda: self.training_shown(first), 120, lambda: self.ready_words(first))
            self.facts["launch_to_ready_s"] = round(time.monotonic() - launched, 1)
            if mode.dflash:
                await self.check_dflash_chart(screen, first)
            if mode.min_power_w is None:
                said = "no GPU on this machine" in screen_text(app)
                self.check("the run screen says plainly that there is no GPU", said)
            else:  # without a GPU there is no reading to agree on, nor a poll to wait for
                await self.agreement()
            await self.save("run-training")
            self.facts["first_run"].update(curves(first))

            self.facts["kill_1"] = await self.kill(first, "kill-report")
            await self.settle("idle_after_kill_1")
            await pilot.press("escape")
            await self.until(lambda: first.state_label != "running", 15, "the first run to read as stopped")

            await pilot.press("e")
            form = await self.showing(EditScreen, 10, "the edit form")
            for name, value in changes.items():
                form.query_one(f"#param-{name}").value = str(value)
            await pilot.pause()
            await self.until(lambda: form.cost_is_current, 30, "the edit form's prediction")
            self.check("the edit form reads the change", form.changes == changes, f"{form.changes}")
            self.facts["edit_cost"] = str(form.query_one("#edit-cost").render())
            if mode.dflash:
                self.check_dflash_cost(first, changes)
            await self.save("edit-form")
            await pilot.click("#keep")
            await self.until(lambda: app.pending.get(first.key) == changes, 10, "the edit to be kept")

            pressed_at, pressed = time.time(), time.monotonic()
            await pilot.press("r")
            second = await self.until(lambda: screen.run_key != first.key and screen.run, 60, "the relaunched run")
            await self.until(lambda: second.steps, 120, "the relaunched run's first step")
            self.facts["r_to_first_step_seen_s"] = round(time.monotonic() - pressed, 2)
            self.facts["r_to_first_step_event_s"] = round(second.steps[0]["time"] - pressed_at, 2)
            await self.until(lambda: len(second.steps) >= 3, 90, "3 steps of the relaunched run")
            if mode.dflash:  # the new run's own chart, not the first run's left on screen
                await self.eventually(lambda: chart_legend(screen, second) is not None, 5)
            await self.save("run-relaunched")
            self.record_second(first, second, changes)

            self.facts["kill_2"] = await self.kill(second, None)
            await self.settle("idle_end")
            if self.nvml.nv is not None:
                ours = {*self.facts["kill_1"]["pids"], *self.facts["kill_2"]["pids"]}
                left = [pid for pid in self.nvml.compute_pids() if pid in ours]
                self.check("no process of the runs left on the GPU", not left, f"left: {left}" if left else "")
        self.check_idle()

    def ready_words(self, run) -> str:
        mode = self.mode
        seen = f"(saw {len(run.steps)} steps, state {run.state_label}"
        if mode.min_power_w is None:
            return f"{mode.loss_points} loss points and 'no GPU on this machine' {seen})"
        reading = app_reading(self.app)
        if reading:
            seen += f", {cell(reading.power_w)} W, {cell(reading.mem_mib)} MiB"
        wanted = f"> {mode.min_power_w:.0f} W and > {mode.min_mem_gib:.0f} GiB and {mode.loss_points} loss points"
        return f"the run screen to show {wanted} {seen})"

    def training_shown(self, run) -> bool:
        mode = self.mode
        if len(run.steps) < mode.loss_points:
            return False
        if mode.min_power_w is None:
            return "no GPU on this machine" in screen_text(self.app)
        reading = app_reading(self.app)
        return bool(
            reading and reading.power_w and reading.mem_mib
            and reading.power_w > mode.min_power_w and reading.mem_mib > mode.min_mem_gib * 1024
        )  # fmt: skip

    async def check_dflash_chart(self, screen: RunScreen, run) -> None:
        """The run screen draws a DFlash run's chart: its total, the loss of the block
        positions the chart picks (first, middle, last) and τ beside the legend; the stats
        give τ and those positions' acceptance."""
        shown = await self.eventually(lambda: chart_legend(screen, run) is not None, 5)
        legend = chart_legend(screen, run, whole=True)
        last = run.last or {}
        names = [f"pos {i + 1}" for i in positions_shown(len(last.get("loss_pos") or ()))]
        self.facts["dflash_chart"] = {"legend": legend, "positions": names, "block_size": run.params.get("block_size")}
        self.check(f"the run screen draws the DFlash chart: the loss per block position ({', '.join(names)}) and τ",
                   shown, legend or "no such legend on the chart")  # fmt: skip
        stats = str(screen.query_one("#stats").render())
        line = next((line for line in stats.splitlines() if line.startswith("τ ")), "")
        self.check("the run's stats give τ and the acceptance per block position", "acc pos " in line,
                   line or "no τ line")  # fmt: skip

    def check_dflash_cost(self, run, changes: dict) -> None:
        """The edit form's peak for the new max_anchors and the largest that fits, against
        the memory model (training/drafters/dflash/memory.py) asked directly, calibrated as the form
        calibrates it on the run's own measured peak; on CPU the form must say it has none."""
        text = self.facts["edit_cost"]
        expected = dflash_prediction(run, changes, gpu_total_gib(self.app.hosts["local"]))
        self.facts["dflash_prediction"] = expected
        if "error" in expected:  # a CPU run's peak is no GPU memory: the model has nothing to scale
            said = "a CPU run: no GPU memory to predict" in text
            self.check("the edit form says plainly it has no memory model for this run",
                       said and self.mode.device == "cpu", expected["error"])  # fmt: skip
            return
        peak = re.search(r"peak memory\s+≈([\d.]+) GiB", text)
        shown = f"≈{expected['reserved_gib']:.1f} GiB"
        self.check(f"the edit form shows the memory model's peak for max_anchors {changes['max_anchors']} "
                   f"({shown}, was ≈{expected['reserved_gib_before']:.1f} at {expected['max_anchors_before']})",
                   bool(peak) and f"≈{peak[1]} GiB" == shown,
                   f"the form: {peak[0] if peak else 'no peak'}")  # fmt: skip
        largest = re.search(r"largest max_anchors that fits at [^:]*: (\d+)", text)
        if expected["largest_max_anchors"] is None:
            self.check("the edit form names no largest max_anchors without a GPU reading", not largest)
            return
        self.check(f"the edit form shows the largest max_anchors that fits ({expected['largest_max_anchors']})",
                   bool(largest) and int(largest[1]) == expected["largest_max_anchors"],
                   largest[0] if largest else "no such line")  # fmt: skip

    async def agreement(self) -> None:
        """The app's reading next to NVML's and nvidia-smi's, taken right after each app poll."""
        host = self.app.hosts["local"]
        samples = []
        for _ in range(AGREEMENT_SAMPLES):
            # the GPU snapshot itself: host.last_ok also moves when a runs listing answers
            seen = host.gpus
            await self.until(lambda: host.gpus is not seen, 10, "a fresh GPU poll", poll=0.01)
            shown = app_reading(self.app)
            smi_started = time.time()
            smi = start_smi()  # first, so its slow start overlaps the NVML read
            direct = self.nvml.read()
            smi = finish_smi(smi, smi_started)
            present = [r for r in (shown, direct, smi) if r is not None]
            times = [r.time for r in present]
            sample = {
                "panel": panel_figures(self.app),
                "readings": [asdict(r) for r in present],
                "spread_ms": round(1000 * (max(times) - min(times))) if times else None,
            }
            if shown and direct and smi:
                power = max(off_by(shown.power_w, direct.power_w) or 0, off_by(shown.power_w, smi.power_w) or 0,
                            off_by(direct.power_w, smi.power_w) or 0)  # fmt: skip
                memory = max(off_by(shown.mem_mib, direct.mem_mib) or 0, off_by(shown.mem_mib, smi.mem_mib) or 0,
                             off_by(direct.mem_mib, smi.mem_mib) or 0)  # fmt: skip
                sample.update(power_off=power, memory_off=memory,
                              agree=power <= POWER_TOLERANCE and memory <= MEMORY_TOLERANCE)  # fmt: skip
            samples.append(sample)
        self.facts["agreement"] = samples
        sources = {r["source"] for s in samples for r in s["readings"]}
        self.check("the app reads this machine's GPU through NVML", "app (nvml)" in sources, f"{sorted(sources)}")
        agreeing = sum(bool(s.get("agree")) for s in samples)
        within = f"power within {POWER_TOLERANCE:.0%}, memory within {MEMORY_TOLERANCE:.0%}"
        self.check(f"app, NVML and nvidia-smi agree ({within})", agreeing == len(samples),
                   f"{agreeing} of {len(samples)} samples")  # fmt: skip

    async def kill(self, run, screenshot: str | None) -> dict:
        pressed = time.monotonic()
        await self.pilot.press("k")
        confirm = await self.showing(KillConfirm, 20, "the kill modal")
        started = {pid: start_ticks(pid) for pid in {*run.info.pids, *confirm.plan.pids}}
        answered = time.monotonic()
        await self.pilot.press("y")
        shown = await self.showing(KillReportScreen, 90, f"the kill report of {run.key}")
        done = time.monotonic()
        report = shown.report
        alive = sorted(pid for pid, ticks in started.items() if still_running(pid, ticks))
        if screenshot:
            await self.save(screenshot)
        # No GPU (--smoke): nothing to verify the release with, and the report says so.
        expected = None if self.mode.name == "smoke" else True
        self.check(f"kill {run.key}: released={expected} in the report", report.released is expected, report.gpu_message)
        self.check(f"kill {run.key}: every PID of the run is gone", not alive, f"alive: {alive}" if alive else "")
        saved = drop_checkpoints(run) if not alive else None
        return {
            "run": run.key, "k_to_release_s": round(done - pressed, 2), "y_to_release_s": round(done - answered, 2),
            "kill_run_s": round(report.seconds, 2),
            "release_s": None if report.release_s is None else round(report.release_s, 3),
            "gpu_released_s": report.gpu_released_s, "checkpoint": report.checkpoint,
            "checkpoint_durable_s": report.checkpoint_durable_s,
            "released": report.released, "sigkilled": report.killed, "alive_after": alive,
            "pids": sorted({*started, *report.signalled}),
            "gpu_mib_before_after": [(d.index, d.before_mib, d.after_mib) for d in report.gpus],
            "stragglers": [p.pid for p in report.stragglers], "gpu_status": report.gpu_status,
            "checkpoint_gib": saved,
        }  # fmt: skip

    def record_second(self, first, run, changes: dict) -> None:
        config = (run.start or {}).get("config", {})
        steps = list(run.steps)
        speeds = [e["tokens_per_s"] for e in steps[1:] if e.get("tokens_per_s")]  # the first compiles
        shape = ("max_anchors", "block_size") if self.mode.dflash else ("ttt_steps",)
        self.facts["second_run"] = {
            "key": run.key, "parent_ok": run.info.parent == first.info.run_id, "steps_seen": len(steps),
            "max_seq_len": config.get("max_seq_len"), **{name: started_with(config, name) for name in shape},
            "tokens_per_s_median": round(statistics.median(speeds)) if speeds else None,
            "peak_mem_gib": max((e.get("peak_mem_gib") or 0 for e in steps), default=None), **curves(run),
        }  # fmt: skip
        trained = {name: started_with(config, name) for name in changes}
        self.check("the relaunched run trains with the edited params", trained == changes, f"{trained}")
        self.check("the relaunched run's parent is the first run", run.info.parent == first.info.run_id)

    def check_idle(self) -> None:
        before = self.facts.get("idle_before", {}).get("NVML")
        for label, words in (("idle_after_kill_1", "the first kill"), ("idle_end", "the second kill")):
            after = self.facts.get(label, {}).get("NVML")
            if before and after:
                gap = after["mem_mib"] - before["mem_mib"]
                detail = (f"idle {before['mem_mib']:,.0f} MiB, after {after['mem_mib']:,.0f} MiB, "
                          f"read {self.facts[f'{label}_waited_s']} s after the report")  # fmt: skip
                self.check(f"after {words} GPU memory is back to idle (within {IDLE_TOLERANCE_MIB} MiB)",
                           gap <= IDLE_TOLERANCE_MIB, detail)  # fmt: skip


def started_with(config: dict, name: str):
    """A parameter as a run's start event resolved it: DFlash's knobs in their sections."""
    if name in DFLASH_KNOBS:
        section, key = DFLASH_KNOBS[name]
        return (config.get(section) or {}).get(key)
    return config.get(name)


def curves(run) -> dict:
    """A run's loss per step (and a DFlash run's τ) as its step events logged them."""
    out = {"loss": [round(e["loss"], 4) for e in run.steps if e.get("loss") is not None]}
    tau = [round(e["tau"], 3) for e in run.steps if isinstance(e.get("tau"), (int, float))]
    return {**out, "tau": tau} if tau else out


def chart_legend(screen: RunScreen, run, *, whole: bool = False) -> str | None:
    """The run screen's chart's legend line once it draws `run` as a DFlash run: its total,
    the block positions tui.curves picks and τ; else None (whole: the line, whatever it holds)."""
    chart = screen.query_one(LossChart)
    rendered = chart.render() if chart.run is run else ""
    line = getattr(rendered, "plain", str(rendered)).split("\n", 1)[0].strip()
    last = run.last or {}
    names = [f"━━ pos {i + 1}" for i in positions_shown(len(last.get("loss_pos") or ()))]
    drawn = bool(names) and "━━ total" in line and all(name in line for name in names) and "τ " in line
    return line if drawn or whole else None


def dflash_prediction(run, changes: dict, gpu_total: float | None) -> dict:
    """What training/drafters/dflash/memory.py predicts for the run with `changes`, scaled to the
    run's measured peak as the edit form scales it; {"error": why} where it cannot."""
    from training.drafters.dflash import memory as dflash
    from training.drafters.measured import shape_from_start
    from training.memory.units import GiB

    try:
        cfg, shape = shape_from_start(run.start or {})
    except ValueError as error:
        return {"error": str(error)}
    peaks = [e["peak_mem_gib"] for e in run.steps if e.get("peak_mem_gib")]
    scale, calibration = 1.0, "none: no measured peak"
    if peaks:
        try:
            scale = dflash.calibrate(cfg, shape, round(max(peaks) * GiB))
            calibration = f"on the run's measured peak, {max(peaks):.2f} GiB (scale {scale:.3f})"
        except ValueError as error:  # the form then predicts uncalibrated too
            calibration = f"none: {error}"
    new = dataclasses.replace(shape, max_anchors=int(changes["max_anchors"]))
    before, after = dflash.predict(cfg, shape, scale), dflash.predict(cfg, new, scale)
    return {
        "max_seq_len": shape.max_seq_len, "block_size": cfg.block_size, "calibration": calibration,
        "max_anchors_before": shape.max_anchors, "reserved_gib_before": before.reserved / GiB,
        "max_anchors": new.max_anchors, "reserved_gib": after.reserved / GiB,
        "allocated_gib": after.total / GiB, "gpu_total_gib": gpu_total,
        "largest_max_anchors": dflash.largest_max_anchors(cfg, new, gpu_total, scale=scale) if gpu_total else None,
    }  # fmt: skip


def drop_checkpoints(run) -> float | None:
    """Delete a killed run's checkpoints (its SIGTERM's save: the disk is shared with other
    measurements); the GiB they held, None when there were none."""
    path = Path(run.info.run_dir or "", "checkpoints")
    if not run.info.run_dir or not path.is_dir():
        return None
    size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())
    shutil.rmtree(path, ignore_errors=True)
    return round(size / 2**30, 2)


def make_data(mode: Mode, facts: dict, timeout: float) -> None:
    """The GPU run's random data (a smoke's is --synthetic), made in a child process so that
    no CUDA context of this one is on the card when the idle readings are taken."""
    if mode.data_dir is None:
        return
    if Path(mode.data_dir, "dataset.json").exists():
        facts["data"] = f"reused {mode.data_dir}"
        return
    started = time.monotonic()
    if mode.dflash:
        argv = [sys.executable, "bench/random_data.py", "--drafter", "dflash", "--preset", mode.preset,
                "--out", mode.data_dir]  # fmt: skip
        maker = "bench/random_data.py --drafter dflash"
    else:
        argv = [sys.executable, "bench/random_data.py", "--preset", mode.preset, "--out", mode.data_dir,
                "--samples", "40", "--length", "2048"]  # fmt: skip
        maker = "bench/random_data.py"
    result = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    if result.returncode:
        raise Stuck(f"{maker} failed: {result.stderr.strip()[-500:]}")
    facts["data"] = f"{result.stdout.strip()} in {time.monotonic() - started:.0f}s"


def end_private_tmux() -> list[int]:
    """End the script's tmux server and every process under its panes; the PIDs that needed SIGKILL."""
    tmux = ["tmux", "-L", TMUX_SOCKET]
    try:
        panes = subprocess.run([*tmux, "list-panes", "-a", "-F", "#{pane_pid}"],
                               capture_output=True, text=True, timeout=5)  # fmt: skip
        table = subprocess.run(["ps", "-eo", "pid=,ppid="], capture_output=True, text=True, timeout=5).stdout
    except subprocess.TimeoutExpired:
        panes, table = None, ""
    children: dict[int, list[int]] = {}
    for line in table.splitlines():
        pid, ppid = map(int, line.split())
        children.setdefault(ppid, []).append(pid)
    tree, todo = {}, [int(p) for p in (panes.stdout.split() if panes else []) if p.isdigit()]
    while todo:
        pid = todo.pop()
        if pid not in tree:
            tree[pid] = start_ticks(pid)
            todo.extend(children.get(pid, []))
    try:
        subprocess.run([*tmux, "kill-server"], capture_output=True, timeout=5)
    except subprocess.TimeoutExpired:
        pass
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and any(still_running(*p) for p in tree.items()):
        time.sleep(0.1)
    forced = [pid for pid, ticks in tree.items() if still_running(pid, ticks)]
    for pid in forced:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return forced


def cell(value, digits: int = 0) -> str:
    if value is None:
        return "—"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value:,.{digits}f}"
    return str(value)


def table(header: list[str], rows: list[list]) -> list[str]:
    """A Markdown table; the first column left-aligned, the others right."""
    if not rows:
        return []
    rule = ["---"] + ["---:"] * (len(header) - 1)
    return [f"| {' | '.join(map(str, row))} |" for row in (header, rule, *rows)] + [""]


def joined(values) -> str:
    return ", ".join(map(str, values))


def report(facts: dict) -> str:
    verdict = "PASSED" if facts.get("passed") else f"FAILED: {facts.get('failure') or 'a check failed'}"
    lines = [
        f"# trackside on a real GPU, end to end ({facts['mode']}, {DRAFTER_NAMES[facts['drafter']]} drafter)", "",
        f"**{verdict}** — {facts.get('date', '')}, {cell(facts.get('wall_s'))} s wall, GPU: {facts['gpu']}", "",
    ]  # fmt: skip
    if facts.get("data"):
        lines += [f"Data: {facts['data']}", ""]

    readings = []
    for label, words in (
        ("idle_before", "idle, before launch"),
        ("idle_after_kill_1", "idle, after the first kill"),
        ("idle_end", "idle, after the second kill"),
    ):
        readings += [[words, r["source"], cell(r["power_w"], 1), cell(r["mem_mib"])]
                     for r in facts.get(label, {}).values()]  # fmt: skip
    for i, sample in enumerate(facts.get("agreement", []), 1):
        readings += [[f"training, sample {i}", r["source"], cell(r["power_w"], 1), cell(r["mem_mib"])]
                     for r in sample["readings"]]  # fmt: skip
    if readings:
        lines += ["## Power and memory (GPU 0)", ""]
        lines += table(["moment", "source", "power (W)", "memory used (MiB)"], readings)

    samples = [s for s in facts.get("agreement", []) if s["readings"]]
    if samples:
        rows = [
            [i, s["panel"], f"{cell(s['spread_ms'])} ms",
             *(f"{s[k]:.2%}" if k in s else "—" for k in ("power_off", "memory_off")),
             {True: "yes", False: "**no**"}.get(s.get("agree"), "—")]
            for i, s in enumerate(samples, 1)
        ]  # fmt: skip
        lines += ["## The app's reading vs NVML vs nvidia-smi at one moment", ""]
        lines += table(["sample", "the run screen's panel", "spread of the 3 reads", "power: largest gap",
                        "memory: largest gap", "agree"], rows)  # fmt: skip
        lines += ["The app's figures are its latest NVML poll; NVML and nvidia-smi were read as soon as that "
                  "poll arrived (nvidia-smi timed at the middle of its run).", ""]  # fmt: skip

    timings = []
    if "launch_to_ready_s" in facts:
        timings.append(["launch → the panel shows training, the loss chart has points",
                        f"{facts['launch_to_ready_s']} s"])  # fmt: skip
    for key, words in (("kill_1", "first run"), ("kill_2", "relaunched run")):
        if k := facts.get(key):
            memory = joined(f"GPU {i}: {b} → {a}" for i, b, a in k["gpu_mib_before_after"]) or "no GPU reading"
            timings += [
                [f"{words}: `k` → kill report with released={k['released']}", f"**{k['k_to_release_s']} s**"],
                [f"{words}: `y` → kill report", f"{k['y_to_release_s']} s"],
                [f"{words}: first signal → verified release (kill_run)", f"{k['kill_run_s']} s"],
                [f"{words}: SIGKILLed after the grace period", joined(k["sigkilled"]) or "none"],
                [f"{words}: GPU memory before → after (MiB, the report)", memory],
                [f"{words}: PIDs gone", ("all of " if not k["alive_after"] else "NOT ") + joined(k["pids"])],
                [f"{words}: its SIGTERM checkpoint, deleted after the checks",
                 f"{cell(k.get('checkpoint_gib'), 2)} GiB"],
            ]
    for key, words in (
        ("r_to_first_step_seen_s", "`r` → the new run's first step, seen by the app"),
        ("r_to_first_step_event_s", "`r` → the new run's first step, by its event's time"),
    ):
        if key in facts:
            timings.append([words, f"**{facts[key]} s**"])
    if timings:
        lines += ["## Timings", ""] + table(["what", "value"], timings)

    if (first := facts.get("first_run")) and (loss := first.get("loss")):
        tau = first.get("tau")
        tau = f", τ {tau[0]} → {tau[-1]}" if tau else ""
        lines += [f"First run ({first['params']}): loss {loss[0]} → {loss[-1]}{tau} "
                  f"over its first {len(loss)} steps.", ""]  # fmt: skip
    if chart := facts.get("dflash_chart"):
        lines += [f"The DFlash chart's legend (block size {chart['block_size']}): `{chart['legend']}`", ""]
    if second := facts.get("second_run"):
        lines += ["## The relaunched run", ""] + relaunched_table(second)
    if length := facts.get("relaunch_length"):
        lines += [f"max_seq_len: {length['why']}.", ""]
    if facts.get("edit_cost"):
        lines += ["The edit form's prediction:", "", "```", facts["edit_cost"].strip(), "```", ""]
    if (model := facts.get("dflash_prediction")) and "error" not in model:
        measured = (facts.get("second_run") or {}).get("peak_mem_gib")
        lines += [
            f"The memory model asked directly (training/drafters/dflash/memory.py, calibrated {model['calibration']}): "
            f"max_anchors {model['max_anchors_before']} → {model['max_anchors']} "
            f"at block size {model['block_size']}, "
            f"max_seq_len {model['max_seq_len']}: peak ≈{model['reserved_gib_before']:.1f} → "
            f"≈{model['reserved_gib']:.1f} GiB reserved ({model['allocated_gib']:.2f} GiB allocated; the relaunched "
            f"run measured {cell(measured, 2)} GiB); the largest max_anchors that fits "
            f"{cell(model['gpu_total_gib'], 1)} GiB: {cell(model['largest_max_anchors'])}.", "",
        ]  # fmt: skip
    elif model:
        lines += [f"The memory model: {model['error']}.", ""]

    lines += ["## Checks", ""]
    for c in facts["checks"]:
        lines.append(f"- [{'x' if c['ok'] else ' '}] {c['what']}" + (f" ({c['detail']})" if c["detail"] else ""))
    if facts.get("forced"):
        lines.append(f"- [ ] clean-up had to SIGKILL {joined(facts['forced'])}")
    lines += ["", "## Screenshots", ""] + [f"- {name}" for name in facts["screenshots"]] + [""]
    return "\n".join(lines)


def relaunched_table(second: dict) -> list[str]:
    loss, tau = second["loss"], second.get("tau")
    shape = [k for k in ("ttt_steps", "max_anchors", "block_size") if k in second]
    header = [*shape, "max_seq_len", "tokens/s (median, steps 2+)", "peak GiB", "steps seen", "loss"]
    row = [*(second[k] for k in shape), second["max_seq_len"], cell(second["tokens_per_s_median"]),
           cell(second["peak_mem_gib"], 2), second["steps_seen"],
           " → ".join(map(str, loss[:1] + loss[-1:]))]  # fmt: skip
    if tau:
        header.append("τ")
        row.append(" → ".join(map(str, tau[:1] + tau[-1:])))
    return table(header, [row])


async def _within(work, seconds: float):
    async with asyncio.timeout(seconds):
        return await work


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="the same flow on CPU with the tiny drafter")
    parser.add_argument("--drafter", choices=DRAFTER_NAMES, default="eagle3", help="the drafter the runs train")
    args = parser.parse_args(argv)
    mode = MODES["smoke" if args.smoke else "gpu", args.drafter]
    budget = mode.budget_s
    started = time.monotonic()
    scratch = Path(tempfile.mkdtemp(prefix="gpu-e2e-"))
    if os.environ.get("OUT"):
        out = Path(os.environ["OUT"])
    else:  # a CPU smoke's pictures never replace the GPU run's in screenshots/
        out = Path(tempfile.mkdtemp(prefix="gpu-e2e-smoke-")) if mode.name == "smoke" else REPO / "screenshots"
    out.mkdir(parents=True, exist_ok=True)
    # The trainers run in tmux panes: they find this repo, and (on CPU) share the cores politely.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    os.environ["TMUX_TMPDIR"] = str(scratch)  # a private tmux server, nothing else touched
    os.environ.pop("TMUX", None)
    if mode.name == "smoke":
        os.environ["OMP_NUM_THREADS"] = "1"

    flow = Flow(mode, out, scratch / "runs")
    facts = flow.facts
    facts["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    finished = threading.Lock()

    def finish(failure: str | None) -> str:
        with finished:
            if "wall_s" in facts:
                return ""
            facts["forced"] = end_private_tmux()
            if failure:
                facts["failure"] = failure
            facts["passed"] = not failure and not facts["forced"] and all(c["ok"] for c in facts["checks"])
            facts["wall_s"] = round(time.monotonic() - started, 1)
            text = report(facts)
            print(text, flush=True)
            name = "gpu_e2e-dflash" if mode.dflash else "gpu_e2e"
            (out / f"{name}.md").write_text(text)
            (out / f"{name}.json").write_text(json.dumps(facts, indent=1, default=str))
            print(f"written to {out}", flush=True)
            shutil.rmtree(scratch, ignore_errors=True)
            return text

    def watchdog() -> None:
        finish(f"the watchdog stopped the script after {budget + WATCHDOG_AFTER_S:.0f}s, "
               f"waiting for {flow.waiting_for()}")
        os._exit(1)

    timer = threading.Timer(budget + WATCHDOG_AFTER_S, watchdog)
    timer.daemon = True
    timer.start()
    failure = None
    try:
        make_data(mode, facts, timeout=budget / 2)
        asyncio.run(_within(flow.run(), budget - (time.monotonic() - started)))
    except TimeoutError:
        failure = f"the flow ran past its budget of {budget:.0f}s, waiting for {flow.waiting_for()}"
    except (Stuck, subprocess.TimeoutExpired) as error:
        failure = str(error)
    except Exception as error:  # the report still says how far it got
        failure = f"{type(error).__name__}: {error}"
    finally:
        timer.cancel()
        finish(failure)
    return 0 if facts["passed"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
