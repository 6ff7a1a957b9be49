"""A fixed fleet fed to the app as monitor messages: the data of the screenshots
(scripts/screenshots.py) and of the snapshot and Pilot tests.

Figures follow the story in DESIGN.md: eight H200s drawing 250 W of 600 W at 100 % util
(an under-fed run), a container host that refuses our key, and a laptop with no GPU.
"""

from __future__ import annotations

import dataclasses
import math

from backends.gpu import GpuProcess, GpuReading, GpuSnapshot, GpuStatus
from backends.hosts import HostUnreachable, LocalHost
from backends.kill import KillPlan
from backends.logs.console import summarize
from backends.runs import NodeInfo, RunInfo, RunPhase
from tui.app import TracksideApp, Watched
from tui.messages import ConsoleBatch, GpusPolled, HostFailed, MetricsBatch, RunsListed

T0 = 1_790_000_000.0  # the frozen clock's start
NOW = T0 + 900.0
RUN_ID = "20261129-0930-a1b2"
RUN_KEY = f"h200-box/{RUN_ID}"
PARAMS = {"max_seq_len": 8192, "ttt_steps": 3, "lr": 3e-4, "steps": 20000, "batch_rows": 1}


def frozen_clock() -> float:
    return NOW


def gpus(power_w: float = 250.0) -> GpuSnapshot:
    readings = tuple(
        GpuReading(i, "NVIDIA H200", f"GPU-{i:04d}", power_w + 7 * i, 600.0, 40960 + 512 * i, 143771, 100, 61 + i)
        for i in range(8)
    )
    processes = tuple(GpuProcess(4242 + i, i, 40000, "python") for i in range(8))
    return GpuSnapshot(GpuStatus.OK, "", readings, processes, NOW, "nvidia-smi")


def run_info(state: RunPhase = RunPhase.RUNNING) -> RunInfo:
    return RunInfo(
        RUN_ID, "eagle3-8k", "h200-box", state, None, dict(PARAMS), 300, 2.1, 4120, [4200],
        f"/root/.trackside/runs/{RUN_ID}", None, "2026-11-29T09:30:00Z",
    )  # fmt: skip


def metrics_events(steps: int = 300, model: dict | None = None) -> list[dict]:
    start = {
        "event": "start",
        "time": T0,
        "process_started": T0 - 4.6,  # the trainer's imports, data and model before it
        "config": {**PARAMS, "model": model or {}},
        "steps_per_epoch": 4120,
        "world_size": 8,
    }
    events = [start]
    for step in range(1, steps + 1):
        wobble = 0.08 * math.sin(step / 3.0)
        ttt = [2.0 * math.exp(-step / 120) + 0.9 + 0.25 * k + wobble for k in range(3)]
        events.append(
            {
                "event": "step",
                "time": T0 + 3.0 * step,
                "step": step,
                "epoch": 0,
                "loss": sum(0.8**k * v for k, v in enumerate(ttt)) / sum(0.8**k for k in range(3)),
                "loss_ttt": ttt,
                "acc_ttt": [0.4, 0.3, 0.2],
                "lr": 3e-4,
                "grad_norm": 1.1,
                "tokens": 61440,
                "tokens_per_s": 20480.0,
                "samples_per_row": 1.0,
                "pad_frac": 0.06,
                "peak_mem_gib": 40.2,
            }
        )
    return events


LOG = [f"step {s} loss={2.0 * math.exp(-s / 120) + 1.1:.4f} lr=3.0e-04 tokens/s=20480" for s in range(280, 301)]


def make_app() -> TracksideApp:
    watched = [
        Watched(LocalHost("h200-box", runs_root="/root/.trackside/runs")),
        Watched(LocalHost("pve-129")),
        Watched(LocalHost("laptop")),
    ]
    app = TracksideApp(watched, monitor=False, clock=frozen_clock)
    # The clock is frozen but a toast's timeout is not: on a loaded machine a snapshot
    # taken more than a timeout after the alert would miss the toast the others show.
    notify = app.notify
    app.notify = lambda message, **kw: notify(message, **{**kw, "timeout": 3600})
    return app


async def feed(pilot, model: dict | None = None) -> None:
    """Post the fleet's state as the monitors would (`model`: the drafter's shape, which
    lets the edit form predict memory)."""
    app = pilot.app
    app.post_message(RunsListed("h200-box", [run_info()], NOW))
    app.post_message(GpusPolled("h200-box", gpus(), NOW - 90))  # starved for a minute and a half
    await pilot.pause()  # a newer poll would replace this one still in the queue
    app.post_message(GpusPolled("h200-box", gpus(), NOW))
    app.post_message(MetricsBatch("h200-box", RUN_KEY, metrics_events(model=model), garbled=1))
    app.post_message(ConsoleBatch("h200-box", RUN_KEY, LOG))
    refused = HostUnreachable("pve-129", "connection refused by 10.0.0.129:22")
    app.post_message(HostFailed("pve-129", "offline", str(refused)))
    app.post_message(RunsListed("laptop", [], NOW))
    app.post_message(GpusPolled("laptop", GpuSnapshot(GpuStatus.NO_SMI, "nvidia-smi not found"), NOW))
    await pilot.pause()


def kill_plan() -> KillPlan:
    """What `k` on the sample run shows: its process list is read from the host, fixed here."""
    started = "Sun Nov 29 09:30:00 2026"
    pids = [4200, 4201, *range(4242, 4250)]
    return KillPlan(
        "h200-box", RUN_ID, "eagle3-8k", RUN_ID, (4200,), {pid: started for pid in pids},
        gpus().processes, (GpuProcess(999, 7, 1024, "jupyter"),), "OK", "", True,
    )  # fmt: skip


# A run trackside did not launch: an HF Trainer in someone's tmux session, its dicts and
# tqdm bar in the pane; and the session the dashboard itself runs in.
FOREIGN_SESSION = "hf-sft"
FOREIGN_KEY = f"h200-box/{FOREIGN_SESSION}"
FOREIGN_LINES = [
    "***** Running training *****",
    "  Num examples = 48,000",
    "  Total optimization steps = 3,000",
    *(
        f"{{'loss': {2.9 * math.exp(-s / 900) + 0.6 + 0.05 * math.sin(s / 40):.4f}, 'grad_norm': 1.3, "
        f"'learning_rate': 2e-05, 'epoch': {s / 1000:.2f}}}"
        for s in range(10, 1810, 10)
    ),
    " 60%|██████    | 1800/3000 [31:40<21:07,  1.06s/it]",
]


def foreign_info() -> RunInfo:
    """As `runs.list_runs` gives it: its pane read through the one console fold."""
    said = summarize(FOREIGN_LINES)
    return RunInfo(
        None, FOREIGN_SESSION, "h200-box", RunPhase.RUNNING, last_step=said.step, last_loss=said.loss,
        pids=[5100], progress=said.progress, eta_s=said.eta_s, console=said, pane="0.0", recorded_since=1796164000.0,
    )  # fmt: skip


def dashboard_info() -> RunInfo:
    return RunInfo(None, "ops", "h200-box", RunPhase.RUNNING, pids=[5300], this_dashboard=True)


async def feed_foreign(pilot, model: dict | None = None) -> None:
    """The fleet of `feed`, with the foreign run and the dashboard's own session listed."""
    await feed(pilot, model)
    app = pilot.app
    app.post_message(RunsListed("h200-box", [run_info(), foreign_info(), dashboard_info()], NOW))
    await pilot.pause()
    app.post_message(ConsoleBatch("h200-box", FOREIGN_KEY, FOREIGN_LINES))
    await pilot.pause()


async def on_run(pilot) -> None:
    """The fleet of `feed`, with the sample run's screen open."""
    await feed(pilot)
    pilot.app.open_run(RUN_KEY)
    await pilot.pause()


# The sample run relaunched with TTT 3 → 5 (issue 24): deeper drafting costs loss early and
# wins it back. Both as run dirs trackside leaves, for `trackside plot` and the overlays.
CHILD_ID = "20261129-1410-c3d4"
CHILD_PARAMS = {**PARAMS, "ttt_steps": 5}


def child_metrics_events(steps: int = 300) -> list[dict]:
    events = metrics_events(steps)
    events[0]["config"].update(CHILD_PARAMS)
    for event in events[1:]:
        step = event["step"]
        ttt = [2.4 * math.exp(-step / 80) + 0.7 + 0.2 * k + 0.08 * math.sin(step / 3.0) for k in range(5)]
        event["loss_ttt"] = ttt
        event["loss"] = sum(0.8**k * v for k, v in enumerate(ttt)) / sum(0.8**k for k in range(5))
    return events


def write_lineage(root) -> None:
    """The sample run and its child as run dirs under `root`: manifests and metrics.jsonl."""
    import json
    from pathlib import Path

    for run_id, params, parent, events in [
        (RUN_ID, PARAMS, None, metrics_events()),
        (CHILD_ID, CHILD_PARAMS, RUN_ID, child_metrics_events()),
    ]:
        directory = Path(root, run_id)
        directory.mkdir(parents=True)
        manifest = {"run_id": run_id, "session": "eagle3-8k", "params": params, "parent": parent, "run_dir": str(directory)}
        (directory / "manifest.json").write_text(json.dumps(manifest))
        (directory / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))


# A DFlash run beside the sample run (issue 22): the story's "experiment-ddtree" (block 16
# here, 1,024 anchors, soft KL 0.15), its later block positions harder to draft, and τ,
# the expected accepted length their accuracies imply, rising as it learns.
DFLASH_ID = "20261129-1130-e5f6"
DFLASH_KEY = f"h200-box/{DFLASH_ID}"
DFLASH_PARAMS = {"max_seq_len": 16384, "max_anchors": 1024, "soft_kl": 0.15, "lr": 6e-4, "steps": 8000}
DFLASH_BLOCK = 16


def dflash_info(state: RunPhase = RunPhase.RUNNING) -> RunInfo:
    return RunInfo(
        DFLASH_ID, "ddtree", "h200-box", state, None, dict(DFLASH_PARAMS), 240, 4.3, 1500, [4300],
        f"/root/.trackside/runs/{DFLASH_ID}", None, "2026-11-29T11:30:00Z",
    )  # fmt: skip


def dflash_events(steps: int = 240, model: dict | None = None) -> list[dict]:
    config = {
        **DFLASH_PARAMS, "ttt_steps": 3, "model": {**(model or {}), "block_size": DFLASH_BLOCK},
        "dflash": {"target_layers": [1, 15, 29, 43, 57], "max_anchors": 1024, "gamma": 7.0, "soft_kl": 0.15},
    }  # fmt: skip
    events = [{"event": "start", "time": T0, "process_started": T0 - 3.9, "config": config, "steps_per_epoch": 1500,
               "world_size": 8}]  # fmt: skip
    weights = [math.exp(-k / 7.0) for k in range(DFLASH_BLOCK - 1)]
    for step in range(1, steps + 1):
        learnt = 1 - math.exp(-step / 90)
        wobble = 0.06 * math.sin(step / 4.0)
        loss_pos = [(2.0 + 0.12 * k) * (2.6 - 1.6 * learnt) + wobble for k in range(DFLASH_BLOCK - 1)]
        acc_pos = [max(0.0, 0.85 * learnt - 0.035 * k) for k in range(DFLASH_BLOCK - 1)]
        tau, run = 0.0, 1.0
        for acc in acc_pos:
            run *= acc
            tau += run
        events.append({
            "event": "step", "time": T0 + 3.5 * step, "step": step, "epoch": 0,
            "loss": sum(w * v for w, v in zip(weights, loss_pos)) / sum(weights),
            "loss_pos": loss_pos, "acc_pos": acc_pos, "tau": tau, "lr": 6e-4, "grad_norm": 0.9,
            "tokens": 131072, "tokens_per_s": 37449.0, "samples_per_row": 3.2, "pad_frac": 0.02,
            "peak_mem_gib": 71.6,
        })  # fmt: skip
    return events


DFLASH_LOG = [
    f"step={e['step']} epoch=0 loss={e['loss']:.4f} acc_0={e['acc_pos'][0]:.3f} lr=6.000e-04 grad_norm=0.900 "
    f"tokens_per_s=37449 peak_mem_gib=71.60"
    for e in dflash_events()[-21:]
]


async def on_dflash_run(pilot, model: dict | None = None) -> None:
    """The fleet of `feed` with the DFlash run listed beside the sample run, its screen open."""
    await feed(pilot, model)
    app = pilot.app
    app.post_message(RunsListed("h200-box", [run_info(), dflash_info()], NOW))
    await pilot.pause()
    app.post_message(MetricsBatch("h200-box", DFLASH_KEY, dflash_events(model=model), garbled=0))
    app.post_message(ConsoleBatch("h200-box", DFLASH_KEY, DFLASH_LOG))
    await pilot.pause()
    app.open_run(DFLASH_KEY)
    await pilot.pause()


# A run spanning two hosts as one torchrun job (issue 23): four H200s on each, node 0 on
# h200-a; the rendezvous gave rank 0 to node 1 on h200-b, so the run's metrics are there.
MULTI_ID = "20261129-1200-d7e8"
MULTI_HOSTS = ("h200-a", "h200-b")
MULTI_KEY = f"{MULTI_HOSTS[0]}/{MULTI_ID}"
MULTI_GPUS = 4
MULTI_PIDS = {"h200-a": [6100], "h200-b": [7100]}  # each node's pane, as its host lists it


def multinode_parts(dead: bool = False) -> list[RunInfo]:
    """What each host lists of the run: its own node's state, the other node unknown.
    `dead`: node 1's worker was SIGKILLed and its torchrun exited 1, node 0 still runs."""
    parts = []
    for i, host in enumerate(MULTI_HOSTS):
        lost = dead and i == 1
        state, status = (RunPhase.EXITED, 1) if lost else (RunPhase.RUNNING, None)
        pids = [] if lost else MULTI_PIDS[host]
        spans = [NodeInfo(h, n, f"ts-{MULTI_ID}", f"/root/.trackside/runs/{MULTI_ID}") for n, h in enumerate(MULTI_HOSTS)]
        spans[i] = NodeInfo(host, i, f"ts-{MULTI_ID}", f"/root/.trackside/runs/{MULTI_ID}", state.value, status, pids)
        rank_0 = i == 1  # only rank 0's run dir has metrics
        parts.append(RunInfo(
            MULTI_ID, f"ts-{MULTI_ID}", host, state, status, dict(PARAMS), 300 if rank_0 else None, 2.1 if rank_0 else None,
            4120 if rank_0 else None, pids, f"/root/.trackside/runs/{MULTI_ID}", None, "2026-11-29T12:00:00Z", nodes=spans,
        ))  # fmt: skip
    return parts


def multinode_gpus(host_index: int) -> GpuSnapshot:
    """Each host's four cards, held by that node's four ranks."""
    readings = tuple(
        GpuReading(i, "NVIDIA H200", f"GPU-{host_index}{i:03d}", 540.0 + 9 * i + 20 * host_index, 600.0, 52224 + 256 * i,
                   143771, 100, 63 + i)
        for i in range(MULTI_GPUS)
    )  # fmt: skip
    processes = tuple(GpuProcess(8000 + 100 * host_index + i, i, 51200 + 256 * i, "python") for i in range(MULTI_GPUS))
    return GpuSnapshot(GpuStatus.OK, "", readings, processes, NOW, "nvidia-smi")


def multinode_events(steps: int = 300) -> list[dict]:
    """The sample run's curve, logged by rank 0 of the 8 ranks with every rank's peak."""
    events = metrics_events(steps)
    for event in events[1:]:
        event["peak_mem_gib_ranks"] = [round(event["peak_mem_gib"] + 0.5 * rank, 1) for rank in range(2 * MULTI_GPUS)]
    return events


def make_multinode_app() -> TracksideApp:
    app = TracksideApp([Watched(LocalHost(name)) for name in MULTI_HOSTS], monitor=False, clock=frozen_clock)
    notify = app.notify  # toasts kept, as make_app keeps them
    app.notify = lambda message, **kw: notify(message, **{**kw, "timeout": 3600})
    return app


async def feed_multinode(pilot, dead: bool = False) -> None:
    """Each host's listing and GPUs as its own monitor posts them; rank 0's metrics."""
    app = pilot.app
    for i, (host, part) in enumerate(zip(MULTI_HOSTS, multinode_parts(dead))):
        app.post_message(RunsListed(host, [part], NOW))
        app.post_message(GpusPolled(host, multinode_gpus(i), NOW))
    await pilot.pause()
    app.post_message(MetricsBatch(MULTI_HOSTS[1], MULTI_KEY, multinode_events(), garbled=0))
    app.post_message(ConsoleBatch(MULTI_HOSTS[1], MULTI_KEY, LOG))
    await pilot.pause()


def multinode_plan() -> KillPlan:
    """What `k` on the multi-node run shows: each node's pane shell, torchrun agent and its
    four workers (the ranks), holding that host's four GPUs; read from the hosts, fixed here."""
    started = "Sun Nov 29 12:00:00 2026"
    parts = []
    for i, host in enumerate(MULTI_HOSTS):
        pane, agent = MULTI_PIDS[host][0], MULTI_PIDS[host][0] + 1
        workers = tuple(range(8000 + 100 * i, 8000 + 100 * i + MULTI_GPUS))
        parts.append(KillPlan(
            host, MULTI_ID, f"ts-{MULTI_ID}", MULTI_ID, (pane,), {pid: started for pid in (pane, agent, *workers)},
            multinode_gpus(i).processes, (), "OK", "", True, manifest={"run_id": MULTI_ID, "node": i}, first=workers,
        ))  # fmt: skip
    head, *rest = parts
    return dataclasses.replace(head, nodes=tuple(rest))


def replay_history():
    """The sample run's past (`trackside replay`'s): 300 steps on eight H200s recorded a
    second apart, the recorder down for a minute, a step skipped, a stop and its end; its
    console's lines indexed by size at each step, as the recorder indexes them."""
    from backends.history import History, Tape
    from backends.recorder.read import Gap, GpuSample, LogSize, Recording

    events = metrics_events(300)
    events.insert(171, {"event": "nonfinite", "time": T0 + 511.0, "step": 171, "what": "loss", "in_a_row": 1})
    events += [{"event": "end", "time": T0 + 905.0, "status": "stopped"}]
    lines, sizes, size = [], [], 0
    for e in events:
        if e["event"] == "step":
            line = f"step {e['step']} loss={e['loss']:.4f} lr=3.0e-04 tokens/s=20480\n".encode()
            lines.append(line)
            size += len(line)
            sizes.append(LogSize(e["time"] + 0.5, f"{RUN_ID}/console.log", size))
    gap = Gap(T0 + 400.0, T0 + 460.0)
    samples = tuple(GpuSample(T0 + t, i, f"GPU-{i:04d}", 250.0 + 7 * i + 40 * math.sin(t / 60), 600.0, 40960.0 + 512 * i, 143771.0, 100.0)
                    for t in range(-10, 910) if not gap.start <= T0 + t <= gap.end for i in range(8))  # fmt: skip
    history = History(RUN_ID, "h200-box", RUN_ID, "eagle3-8k", T0 - 5.0, T0 + 905.0, True, events, params=dict(PARAMS),
                      exit_status=0, tape=Tape(f"{RUN_ID}/console.log", current=b"".join(lines), sizes=[(s.time, s.size) for s in sizes]),
                      stops=[{"signal": "TERM", "time": T0 + 904.0}])  # fmt: skip
    history.record(Recording(gpus=samples, procs=(), panes=(), logs=tuple(sizes), gaps=(gap,), coarse_before=None))
    return history
