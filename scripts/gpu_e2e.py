"""The dashboard supervising a real training run on this machine's GPU, end to end (issue 6).

The real app runs headless (Textual Pilot) on LocalHost, with real tmux (a private server)
and real NVML. It launches a Llama-3.1-8B-shaped drafter, waits until the run screen shows
real power, memory and a loss curve, checks the app's reading against NVML and nvidia-smi
read at the same moment, presses k + y and checks the release, edits TTT and max_seq_len
(e), relaunches (r), watches the new run train and kills it too. It prints a Markdown
report and writes it, the raw figures and SVG screenshots to $OUT (else screenshots/; for
--smoke, a new temporary directory).

    PYTHONPATH=$PWD python3 scripts/gpu_e2e.py      # on a machine with an NVIDIA GPU
    .venv/bin/python scripts/gpu_e2e.py --smoke     # the same flow on CPU, tiny drafter

Every wait is bounded, the flow stops within BUDGET_S and a watchdog ends the process soon
after; whatever the script started (the tmux server, the trainers) is ended on the way out.
Exit status 0 when every check passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
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
from tui.app import Demo, TracksideApp, Watched  # noqa: E402
from tui.screens.edit import EditScreen  # noqa: E402
from tui.screens.kill import KillConfirm, KillReportScreen  # noqa: E402
from tui.screens.run import RunScreen  # noqa: E402

BUDGET_S = 380.0  # the whole flow, data included; with the watchdog and clean-up, under 7 minutes
WATCHDOG_S = BUDGET_S + 15  # past this the process ends itself, even if a call blocks
SIZE = (160, 48)
TMUX_SOCKET = "trackside-gpu-e2e"
SESSION = "gpu-e2e"
DATA_DIR = "/tmp/data-8b"
RELAUNCH_TTT = 5
POWER_TOLERANCE = 0.05  # power moves step to step; memory barely does
MEMORY_TOLERANCE = 0.01
IDLE_TOLERANCE_MIB = 100  # "back to idle": within this of the memory used before launch
AGREEMENT_SAMPLES = 3
SMI_QUERY = ["nvidia-smi", "--query-gpu=power.draw,memory.used", "--format=csv,noheader,nounits", "--id=0"]


@dataclass(frozen=True)
class Mode:
    name: str
    preset: str
    data: tuple[str, ...]  # the trainer's flags choosing its data
    device: str
    params: dict  # the first run's max_seq_len and ttt_steps
    min_power_w: float | None  # the run screen must show more than this before the checks
    min_mem_gib: float | None
    loss_points: int
    length_cap: int  # the relaunch's max_seq_len: the largest that fits, at most this
    card_gib: float | None  # the card size handed to `fit` when NVML reads none (CPU smoke)
    # A short schedule on the GPU, so warm-up ends and the loss falls visibly on screen.
    schedule: tuple[str, ...] = ("--steps", "100000")

    def train_argv(self) -> list[str]:
        # Not installed as a package on the GPU box: the trainer is this Python's module.
        return [
            sys.executable, "-m", "training", "train", *self.data, "--preset", self.preset,
            "--device", self.device, "--max-seq-len", str(self.params["max_seq_len"]),
            "--ttt-steps", str(self.params["ttt_steps"]), *self.schedule, "--save-every", "0",
        ]  # fmt: skip


# 3000 steps: the flow stops the run itself; at 8192 x 3 the trainer now finishes 300 steps
# (~40 s) before the screen has gathered its 40 loss points.
GPU = Mode("gpu", "llama3-8b", ("--data", DATA_DIR), "cuda", {"max_seq_len": 8192, "ttt_steps": 3},
           300.0, 10.0, 40, 16384, None, ("--steps", "3000", "--lr", "1e-3"))  # fmt: skip
SMOKE = Mode("smoke", "tiny", ("--synthetic",), "cpu", {"max_seq_len": 256, "ttt_steps": 2},
             None, None, 5, 512, 4.0)  # fmt: skip


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
        self.facts: dict = {"mode": mode.name, "gpu": self.nvml.name, "screenshots": [], "checks": []}
        self.app: TracksideApp | None = None
        self.pilot = None
        self.waiting = "nothing yet"  # str, or a callable saying what was seen instead

    def waiting_for(self) -> str:
        return self.waiting() if callable(self.waiting) else self.waiting

    async def until(self, condition, timeout: float, what, poll: float = 0.1):
        """Let the app run until condition() is true; Stuck, naming what never happened."""
        self.waiting = what
        deadline = time.monotonic() + timeout
        while not (value := condition()):
            if time.monotonic() >= deadline:
                raise Stuck(f"timed out after {timeout:.0f}s waiting for {self.waiting_for()}")
            await self.pilot.pause(poll)
        return value

    async def showing(self, kind: type, timeout: float, what: str):
        """The screen on top once it is a `kind`."""
        return await self.until(lambda: isinstance(self.app.screen, kind) and self.app.screen, timeout, what)

    def check(self, what: str, ok: bool, detail: str = "") -> None:
        self.facts["checks"].append({"what": what, "ok": bool(ok), "detail": detail})

    def save(self, name: str) -> None:
        path = Path(self.app.save_screenshot(f"{name}.svg", str(self.out)))
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

    def relaunch_length(self) -> int:
        from training import memory
        from training.config import PRESETS

        reading = self.nvml.read()
        card = reading.total_mib / 1024 if reading else self.mode.card_gib
        largest = memory.largest_fitting(PRESETS[self.mode.preset], RELAUNCH_TTT, card)
        chosen = min(largest, self.mode.length_cap)
        where = "the card's total from NVML" if reading else "a nominal card (no GPU here)"
        self.facts["relaunch_length"] = {
            "card_gib": round(card, 1), "largest_fitting": largest, "cap": self.mode.length_cap, "chosen": chosen,
            "why": f"training.memory.largest_fitting({self.mode.preset}, ttt_steps={RELAUNCH_TTT}, "
                   f"gpu_mem_gib={card:.1f}, {where}; uncalibrated) = {largest}, capped at "
                   f"{self.mode.length_cap} to keep each step short",
        }  # fmt: skip
        return chosen

    async def run(self) -> None:
        mode = self.mode
        self.idle("idle_before")
        new_length = self.relaunch_length()
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
            if mode.min_power_w is None:
                said = "no GPU on this machine" in screen_text(app)
                self.check("the run screen says plainly that there is no GPU", said)
            else:  # without a GPU there is no reading to agree on, nor a poll to wait for
                await self.agreement()
            self.save("run-training")
            self.facts["first_run"]["loss"] = [round(e["loss"], 4) for e in first.steps if e.get("loss") is not None]

            self.facts["kill_1"] = await self.kill(first, "kill-report")
            await self.settle("idle_after_kill_1")
            await pilot.press("escape")
            await self.until(lambda: first.state_label != "running", 15, "the first run to read as stopped")

            await pilot.press("e")
            form = await self.showing(EditScreen, 10, "the edit form")
            changes = {"max_seq_len": new_length, "ttt_steps": RELAUNCH_TTT}
            form.query_one("#param-max_seq_len").value = str(new_length)
            form.query_one("#param-ttt_steps").value = str(RELAUNCH_TTT)
            await pilot.pause()
            await self.until(lambda: form.cost_is_current, 30, "the edit form's prediction")
            self.check("the edit form reads the change", form.changes == changes, f"{form.changes}")
            self.facts["edit_cost"] = str(form.query_one("#edit-cost").render())
            self.save("edit-form")
            await pilot.click("#keep")
            await self.until(lambda: app.pending.get(first.key) == changes, 10, "the edit to be kept")

            pressed_at, pressed = time.time(), time.monotonic()
            await pilot.press("r")
            second = await self.until(lambda: screen.run_key != first.key and screen.run, 60, "the relaunched run")
            await self.until(lambda: second.steps, 120, "the relaunched run's first step")
            self.facts["r_to_first_step_seen_s"] = round(time.monotonic() - pressed, 2)
            self.facts["r_to_first_step_event_s"] = round(second.steps[0]["time"] - pressed_at, 2)
            await self.until(lambda: len(second.steps) >= 3, 90, "3 steps of the relaunched run")
            self.save("run-relaunched")
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
            self.save(screenshot)
        self.check(f"kill {run.key}: released=True in the report", report.released, report.gpu_message)
        self.check(f"kill {run.key}: every PID of the run is gone", not alive, f"alive: {alive}" if alive else "")
        return {
            "run": run.key, "k_to_release_s": round(done - pressed, 2), "y_to_release_s": round(done - answered, 2),
            "kill_run_s": round(report.seconds, 2),
            "release_s": None if report.release_s is None else round(report.release_s, 3),
            "released": report.released, "sigkilled": report.killed, "alive_after": alive,
            "pids": sorted({*started, *report.signalled}),
            "gpu_mib_before_after": [(d.index, d.before_mib, d.after_mib) for d in report.gpus],
            "stragglers": [p.pid for p in report.stragglers], "gpu_status": report.gpu_status,
        }  # fmt: skip

    def record_second(self, first, run, changes: dict) -> None:
        config = (run.start or {}).get("config", {})
        steps = list(run.steps)
        speeds = [e["tokens_per_s"] for e in steps[1:] if e.get("tokens_per_s")]  # the first compiles
        self.facts["second_run"] = {
            "key": run.key, "parent_ok": run.info.parent == first.info.run_id,
            "ttt_steps": config.get("ttt_steps"), "max_seq_len": config.get("max_seq_len"), "steps_seen": len(steps),
            "tokens_per_s_median": round(statistics.median(speeds)) if speeds else None,
            "peak_mem_gib": max((e.get("peak_mem_gib") or 0 for e in steps), default=None),
            "loss": [round(e["loss"], 4) for e in steps if e.get("loss") is not None],
        }  # fmt: skip
        trained = {"max_seq_len": config.get("max_seq_len"), "ttt_steps": config.get("ttt_steps")}
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


def make_data(mode: Mode, facts: dict, timeout: float) -> None:
    if mode is SMOKE:
        return
    if Path(DATA_DIR, "dataset.json").exists():
        facts["data"] = f"reused {DATA_DIR}"
        return
    started = time.monotonic()
    argv = [sys.executable, "bench/random_data.py", "--preset", mode.preset, "--out", DATA_DIR,
            "--samples", "40", "--length", "2048"]  # fmt: skip
    result = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    if result.returncode:
        raise Stuck(f"bench/random_data.py failed: {result.stderr.strip()[-500:]}")
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
        f"# trackside on a real GPU, end to end ({facts['mode']})", "",
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
        lines += [f"First run ({first['params']}): loss {loss[0]} → {loss[-1]} over its first {len(loss)} steps.", ""]
    if second := facts.get("second_run"):
        loss = second["loss"]
        lines += ["## The relaunched run", ""]
        lines += table(
            ["TTT", "max_seq_len", "tokens/s (median, steps 2+)", "peak GiB", "steps seen", "loss"],
            [[second["ttt_steps"], second["max_seq_len"], cell(second["tokens_per_s_median"]),
              cell(second["peak_mem_gib"], 2), second["steps_seen"], " → ".join(map(str, loss[:1] + loss[-1:]))]],
        )  # fmt: skip
    if length := facts.get("relaunch_length"):
        lines += [f"max_seq_len: {length['why']}.", ""]
    if facts.get("edit_cost"):
        lines += ["The edit form's prediction:", "", "```", facts["edit_cost"].strip(), "```", ""]

    lines += ["## Checks", ""]
    for c in facts["checks"]:
        lines.append(f"- [{'x' if c['ok'] else ' '}] {c['what']}" + (f" ({c['detail']})" if c["detail"] else ""))
    if facts.get("forced"):
        lines.append(f"- [ ] clean-up had to SIGKILL {joined(facts['forced'])}")
    lines += ["", "## Screenshots", ""] + [f"- {name}" for name in facts["screenshots"]] + [""]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="the same flow on CPU with the tiny drafter")
    args = parser.parse_args(argv)
    mode = SMOKE if args.smoke else GPU
    started = time.monotonic()
    scratch = Path(tempfile.mkdtemp(prefix="gpu-e2e-"))
    if os.environ.get("OUT"):
        out = Path(os.environ["OUT"])
    else:  # a CPU smoke's pictures never replace the GPU run's in screenshots/
        out = Path(tempfile.mkdtemp(prefix="gpu-e2e-smoke-")) if mode is SMOKE else REPO / "screenshots"
    out.mkdir(parents=True, exist_ok=True)
    # The trainers run in tmux panes: they find this repo, and (on CPU) share the cores politely.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    os.environ["TMUX_TMPDIR"] = str(scratch)  # a private tmux server, nothing else touched
    os.environ.pop("TMUX", None)
    if mode is SMOKE:
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
            (out / "gpu_e2e.md").write_text(text)
            (out / "gpu_e2e.json").write_text(json.dumps(facts, indent=1, default=str))
            print(f"written to {out}", flush=True)
            shutil.rmtree(scratch, ignore_errors=True)
            return text

    def watchdog() -> None:
        finish(f"the watchdog stopped the script after {WATCHDOG_S:.0f}s, waiting for {flow.waiting_for()}")
        os._exit(1)

    timer = threading.Timer(WATCHDOG_S, watchdog)
    timer.daemon = True
    timer.start()
    failure = None
    try:
        make_data(mode, facts, timeout=BUDGET_S / 2)
        asyncio.run(asyncio.wait_for(flow.run(), BUDGET_S - (time.monotonic() - started)))
    except (asyncio.TimeoutError, TimeoutError):
        failure = f"the flow ran past its budget of {BUDGET_S:.0f}s, waiting for {flow.waiting_for()}"
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
