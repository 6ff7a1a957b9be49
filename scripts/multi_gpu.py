#!/usr/bin/env python3
"""Several GPUs for real (issue 7): torchrun scaling against one GPU, loss agreement at the
same global batch, and a scoped kill of a multi-GPU run next to a bystander holding memory.

    PYTHONPATH=<repo> python3 scripts/multi_gpu.py            # N = 2 H200s (--gpus N)
    PYTHONPATH=<repo> python3 scripts/multi_gpu.py --smoke    # CPU, gloo, fake nvidia-smi

Prints a Markdown report, also written to $OUT/multi_gpu.md when OUT is set (with the runs'
metrics.jsonl files beside it). Each stage has a time limit within one overall budget, and a
failed stage is reported, not fatal.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from backends import gpu, kill, procs, runs, tmux  # noqa: E402
from backends.hosts import LocalHost  # noqa: E402

# The lent machines need NVLink multicast off; every child inherits these from os.environ.
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                "NVSHMEM_DISABLE_NVLS": "1"}
WARMUP_STEPS = 3  # CUDA context, kernel selection and allocator growth: not steady state
LOSS_RTOL = 2e-3
TOLERANCE_WHY = (
    "bf16 autocast runs one GPU's 2-row batch and each rank's 1-row half with other kernels, "
    "and NCCL sums gradients in another order than one backward pass, so the losses may differ "
    "by rounding; 2e-3 is half of bf16's unit roundoff (2^-8): below one bf16 rounding of the "
    "loss itself, and far below the 2x a normalisation bug would give. The global batch itself "
    "is checked exactly: every step's token count must be equal."
)
SAMPLE_S = 1.0  # GPU memory sampling period during the training runs
BYSTANDER_MIB = 2048


@dataclass
class Plan:
    gpus: int
    device: str
    data_args: list[str]
    train_args: list[str]  # shared by every run, without --steps/--batch-rows/--out
    steps: int
    smi: str
    nvml: bool
    bystander_gpu: int
    fake_procs: Path | None  # smoke: the fake nvidia-smi's list of GPU processes

    def train(self, steps: int, batch_rows: int) -> list[str]:
        return ["-m", "training", "train", *self.train_args, "--steps", str(steps),
                "--batch-rows", str(batch_rows)]

    def torchrun(self, steps: int, batch_rows: int) -> list[str]:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc_per_node", str(self.gpus), *self.train(steps, batch_rows)]


def gpu_plan(gpus: int) -> Plan:
    data = Path("/tmp/data-8b")
    return Plan(
        gpus=gpus, device="cuda",
        data_args=["--preset", "llama3-8b", "--out", str(data), "--samples", "40", "--length", "2048"],
        train_args=["--data", str(data), "--preset", "llama3-8b", "--max-seq-len", "8192",
                    "--ttt-steps", "5", "--device", "cuda", "--seed", "0", "--save-every", "0"],
        steps=20, smi="nvidia-smi", nvml=True, bystander_gpu=1, fake_procs=None)


def smoke_plan(work: Path) -> Plan:
    data = work / "data-tiny"
    procs = work / "fake-gpu-procs.json"
    procs.write_text("[]")
    # The kill verification reads the fake nvidia-smi: two GPUs, holders as declared in procs.
    # One thread per process: the 1-process and 2-process runs then use the CPU alike.
    os.environ.update(FAKE_NVIDIA_SMI_PROCS=str(procs), FAKE_NVIDIA_SMI_GPUS="2", OMP_NUM_THREADS="1")
    return Plan(
        gpus=2, device="cpu",
        data_args=["--preset", "tiny", "--out", str(data), "--samples", "40", "--length", "256"],
        train_args=["--data", str(data), "--preset", "tiny", "--max-seq-len", "1024",
                    "--ttt-steps", "3", "--device", "cpu", "--seed", "0", "--save-every", "0"],
        steps=8, smi=str(REPO / "tests" / "fake_nvidia_smi.py"), nvml=False, bystander_gpu=1,
        fake_procs=procs)


class Budget:
    def __init__(self, seconds: float):
        self.deadline = time.monotonic() + seconds

    def left(self, cap: float, floor: float = 1.0) -> float:
        return max(floor, min(cap, self.deadline - time.monotonic()))


def keep(metrics: Path, name: str) -> None:
    """A run's metrics.jsonl into $OUT (when set), to come back with the report."""
    if os.environ.get("OUT") and metrics.exists():
        shutil.copyfile(metrics, Path(os.environ["OUT"], f"multi_gpu-{name}.metrics.jsonl"))


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no output)"


def events(metrics: Path) -> list[dict]:
    try:
        text = metrics.read_text()
    except OSError:
        return []
    return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]


def step_events(metrics: Path) -> list[dict]:
    return [e for e in events(metrics) if e["event"] == "step"]


async def run_tree(host, root: int) -> dict[int, str]:
    """The live processes of root's tree: pid → start time (identity against pid reuse)."""
    table = await procs.process_table(host)
    return {pid: table[pid].started for pid in procs.descendants(table, {root})}


@dataclass
class TrainRun:
    label: str
    command: list[str]
    env: dict[str, str]
    out: Path
    returncode: int | None = None
    seconds: float = 0.0
    driver_peak_mib: dict[int, int] = field(default_factory=dict)  # GPU → max MiB of the run's processes

    @property
    def steps(self) -> list[dict]:
        return step_events(self.out / "metrics.jsonl")


async def train(host, plan: Plan, run: TrainRun, timeout: float) -> TrainRun:
    """Run to completion, sampling the GPU memory its processes hold as the driver sees it."""
    log = run.out.with_suffix(".log")
    started = time.monotonic()
    with open(log, "w") as output:
        proc = await asyncio.create_subprocess_exec(
            *run.command, "--out", str(run.out), cwd=REPO, env={**os.environ, **run.env},
            stdout=output, stderr=subprocess.STDOUT)
        try:
            while proc.returncode is None and time.monotonic() - started < timeout:
                pids = await run_tree(host, proc.pid)
                snapshot = await gpu.read_gpus(host, plan.smi, nvml=plan.nvml)
                for p in snapshot.processes_of(pids):
                    if p.gpu_index is not None and p.used_mib:
                        run.driver_peak_mib[p.gpu_index] = max(p.used_mib, run.driver_peak_mib.get(p.gpu_index, 0))
                try:
                    async with asyncio.timeout(SAMPLE_S):
                        await proc.wait()
                except TimeoutError:
                    pass
        finally:
            if proc.returncode is None:  # over time: the whole tree (torchrun's workers setsid)
                for pid in await run_tree(host, proc.pid):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            await proc.wait()
    run.returncode, run.seconds = proc.returncode, time.monotonic() - started
    return run


def steady_tokens_per_s(steps: list[dict]) -> float | None:
    late = steps[WARMUP_STEPS:] or steps
    return statistics.median(e["tokens_per_s"] for e in late) if late else None


def fmt(value, spec: str = ",.0f", missing: str = "–") -> str:
    return missing if value is None else format(value, spec)


def train_section(plan: Plan, one: TrainRun, many: TrainRun) -> list[str]:
    n = plan.gpus
    lines = ["## Training: 1 GPU against N at the same global batch", ""]
    for run in (one, many):
        lines.append(f"- {run.label}: `{' '.join(run.command)} --out {run.out}` "
                     f"({' '.join(f'{k}={v}' for k, v in run.env.items()) or 'no extra env'}), "
                     f"exit {run.returncode}, {run.seconds:.0f} s wall")
    failed = [r for r in (one, many) if r.returncode != 0 or not r.steps]
    for run in failed:
        lines += ["", f"**{run.label} failed** (exit {run.returncode}); last output:", "```",
                  tail(run.out.with_suffix(".log")), "```"]
    if failed:
        return lines
    tps_one, tps_many = steady_tokens_per_s(one.steps), steady_tokens_per_s(many.steps)
    efficiency = tps_many / (n * tps_one)
    last = many.steps[-1]
    ranks = last.get("peak_mem_gib_ranks")
    rank_peaks = (", ".join(f"rank {r}: {g:.2f}" for r, g in enumerate(ranks)) if ranks else
                  f"rank 0: {last['peak_mem_gib']:.2f} (other ranks: the step event lacks "
                  "peak_mem_gib_ranks — training/metrics.py does not accept it yet)")
    driver = lambda run: ", ".join(f"GPU {i}: {m / 1024:.2f}" for i, m in sorted(run.driver_peak_mib.items())) or "–"  # noqa: E731
    lines += [
        "", f"Median over steps {WARMUP_STEPS + 1}–{len(one.steps)} (the first {WARMUP_STEPS} are warm-up).", "",
        f"| | {one.label} | {many.label} |", "|---|---:|---:|",
        f"| tokens/s total | {fmt(tps_one)} | {fmt(tps_many)} |",
        f"| tokens/s per GPU | {fmt(tps_one)} | {fmt(tps_many / n)} |",
        f"| tokens per step (global batch) | {fmt(one.steps[-1]['tokens'])} | {fmt(last['tokens'])} |",
        f"| torch peak GiB (max_memory_allocated; RSS on CPU) | {one.steps[-1]['peak_mem_gib']:.2f} | {rank_peaks} |",
        f"| driver peak GiB per GPU (the run's processes, sampled every {SAMPLE_S:.0f} s) | {driver(one)} | {driver(many)} |",
        "", f"**Scaling efficiency** = tokens/s on {n} / ({n} × tokens/s on 1) = "
        f"{fmt(tps_many)} / ({n} × {fmt(tps_one)}) = **{efficiency:.1%}**", "",
    ]
    by_step = {e["step"]: e for e in many.steps}
    lines += ["| step | tokens (1 / N) | loss 1 GPU | loss N GPUs | relative difference |",
              "|---:|---:|---:|---:|---:|"]
    worst, tokens_equal = 0.0, True
    for a in one.steps:
        b = by_step.get(a["step"])
        if b is None:
            lines.append(f"| {a['step']} | {a['tokens']} / – | {a['loss']:.6f} | – | – |")
            tokens_equal = False
            continue
        rel = abs(b["loss"] - a["loss"]) / abs(a["loss"])
        worst, tokens_equal = max(worst, rel), tokens_equal and a["tokens"] == b["tokens"]
        lines.append(f"| {a['step']} | {a['tokens']} / {b['tokens']} | {a['loss']:.6f} | {b['loss']:.6f} | {rel:.2e} |")
    moved = abs(one.steps[-1]["loss"] - one.steps[0]["loss"]) / abs(one.steps[0]["loss"])
    verdict = "within" if worst <= LOSS_RTOL and len(by_step) == len(one.steps) else "NOT within"
    lines += [
        "", f"Max relative loss difference: **{worst:.2e}**, {verdict} the tolerance {LOSS_RTOL:g} "
        f"(for scale: the 1-GPU loss itself moves {moved:.2e} relative from the first to the last step). "
        f"Tokens per step {'identical' if tokens_equal else 'DIFFER'} in every step (the same global batch).",
        "", f"Tolerance {LOSS_RTOL:g}: {TOLERANCE_WHY}",
    ]
    return lines


BYSTANDER_GPU = """
import time, torch
x = torch.empty({mib} * 2**20, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print("ready", flush=True)
time.sleep(3600)
"""
BYSTANDER_CPU = "import time; print('ready', flush=True); time.sleep(3600)"


async def start_bystander(plan: Plan) -> subprocess.Popen:
    """A process outside tmux holding ~2 GiB on one GPU (smoke: declared to the fake)."""
    env = dict(os.environ)
    code = BYSTANDER_CPU
    if plan.device == "cuda":
        env["CUDA_VISIBLE_DEVICES"] = str(plan.bystander_gpu)
        code = BYSTANDER_GPU.format(mib=BYSTANDER_MIB)
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    async with asyncio.timeout(120):
        line = await asyncio.to_thread(proc.stdout.readline)
    if line.strip() != "ready":
        proc.kill()
        raise RuntimeError(f"the bystander did not start: {line!r}")
    return proc


def declare_fake_holders(plan: Plan, workers: list[int], bystander: int) -> None:
    """Smoke only: rank i holds memory on fake GPU i; the bystander on its GPU."""
    rows = [{"pid": pid, "gpu": i, "used_mib": 1000, "name": "python3"} for i, pid in enumerate(workers)]
    rows.append({"pid": bystander, "gpu": plan.bystander_gpu, "used_mib": BYSTANDER_MIB, "name": "python3"})
    plan.fake_procs.write_text(json.dumps(rows))


def is_worker(pid: int) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"training" in argv and b"torch.distributed.run" not in argv


async def wait_for_steps(host, info, count: int, timeout: float) -> list[dict]:
    metrics = Path(info.run_dir, "metrics.jsonl")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        steps = step_events(metrics)
        if len(steps) >= count:
            return steps
        if await runs.read_exit_status(host, info.run_dir) is not None:
            break
        await asyncio.sleep(0.5)
    raise RuntimeError(f"the run has {len(step_events(metrics))} step events (wanted {count}); "
                       f"console.log ends:\n{tail(Path(info.run_dir, 'console.log'))}")


async def kill_section(host, plan: Plan, budget: Budget) -> list[str]:
    lines = ["## Scoped kill across GPUs", ""]
    visible = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, range(plan.gpus)))} if plan.device == "cuda" else {}
    argv = ["env", *(f"{k}={v}" for k, v in {**NO_MULTICAST, **visible}.items()),
            *plan.torchrun(100000, 1)]
    info = bystander = None
    try:
        bystander = await start_bystander(plan)
        info = await runs.launch(host, argv)
        lines.append(f"- launched {info.run_id} in tmux session `{info.session}`: `{' '.join(argv)}`")
        steps = await wait_for_steps(host, info, 3, budget.left(240, floor=90))  # the kill is the point
        lines.append(f"- bystander: pid {bystander.pid}, `python3 -c` outside tmux, "
                     f"{BYSTANDER_MIB} MiB on GPU {plan.bystander_gpu}")
        table = await procs.process_table(host)
        tree = {pid: table[pid].started
                for pid in procs.process_tree(table, await tmux.list_panes(host, info.session))}
        workers = sorted(pid for pid in tree if is_worker(pid))
        if plan.fake_procs:
            declare_fake_holders(plan, workers, bystander.pid)
        lines.append(f"- killing after {len(steps)} step events; the run's tree: {len(tree)} processes, "
                     f"workers (one per rank) {workers}")
        report = await kill.kill_run(host, info.run_id, grace_s=30, smi=plan.smi, nvml=plan.nvml)
        after = await procs.process_table(host)
        remaining = sorted(pid for pid, started in tree.items()
                           if pid in after and after[pid].started == started and not after[pid].zombie)
        end = [e for e in events(Path(info.run_dir, "metrics.jsonl")) if e["event"] in ("end", "checkpoint")]
        named = [p for p in report.other_holders if p.pid == bystander.pid]
        survived = bystander.poll() is None
        lines += [
            f"- signalled (SIGTERM): {report.signalled}; SIGKILL after the grace period: {report.killed or 'none'}; "
            f"survivors: {report.survivors or 'none'}",
            f"- run processes in `ps` afterwards: {remaining or 'none'} "
            f"({'every worker is gone' if not remaining else 'NOT all gone'})",
            f"- the run's exit status: {report.exit_status}; trainer's last events: "
            + (", ".join(f"{e['event']} {e.get('status') or e.get('path')}" for e in end) or "none")
            + (" (torchrun's agent exits 1 when it is itself sent SIGTERM — SignalException — even "
               "though its workers stopped cleanly)" if report.exit_status == 1 and end and end[-1].get("status") == "stopped" else ""),
            f"- the run's processes holding GPU memory before the kill: "
            + (", ".join(f"pid {p.pid} GPU {p.gpu_index} {p.used_mib:,} MiB" for p in report.gpu_processes_before) or "none")
            + f"; stragglers after: {report.stragglers or 'none'}"
            + ("" if report.gpu_processes_before or plan.device != "cuda" else
               " — none of the run's pids was seen on a GPU: the driver may report pids of another "
               "PID namespace (a container), and then the release check cannot see the run"),
            f"- released: **{report.released}** (GPU check {report.gpu_status}{': ' + report.gpu_message if report.gpu_message else ''}); "
            f"release_s (last exit → verified) = {fmt(report.release_s, '.3f')} s; whole kill {report.seconds:.2f} s",
            f"- bystander pid {bystander.pid}: {'**alive**' if survived else '**DEAD**'}, "
            + (f"**named in other_holders** (GPU {named[0].gpu_index}, {fmt(named[0].used_mib, ',')} MiB)" if named
               else f"**NOT named** in other_holders ({report.other_holders})"),
            "", "| GPU | MiB before | MiB after |", "|---:|---:|---:|",
            *(f"| {g.index} | {fmt(g.before_mib, ',')} | {fmt(g.after_mib, ',')} |" for g in report.gpus),
        ]
    except Exception as error:  # noqa: BLE001 — the report says what failed, the run goes on
        lines += ["", f"**the kill stage failed**: {type(error).__name__}: {error}"]
        if info is not None:
            try:
                await kill.kill_run(host, info.run_id, grace_s=5, smi=plan.smi, nvml=plan.nvml)
            except Exception as again:  # noqa: BLE001
                lines.append(f"and stopping the run failed too: {again} — see `ps` for {info.run_dir}")
    finally:
        if bystander is not None:
            bystander.kill()
            bystander.wait()
            lines += ["", f"The bystander was then killed by this script (exit {bystander.returncode})."]
        if info is not None:
            keep(Path(info.run_dir, "metrics.jsonl"), "kill-run")
    return lines


def header(plan: Plan, smoke: bool) -> list[str]:
    import torch  # versions only: the parent never touches CUDA, so it holds no GPU memory

    mode = "SMOKE (CPU, gloo, fake nvidia-smi — figures are not GPU figures)" if smoke else f"{plan.gpus} GPUs, NCCL"
    return [f"# trackside on several GPUs — {mode}", "",
            f"torch {torch.__version__} (CUDA {torch.version.cuda}), python {sys.version.split()[0]}, "
            f"children's env: {' '.join(f'{k}={v}' for k, v in NO_MULTICAST.items())}", ""]


async def gpu_lines(host, plan: Plan) -> list[str]:
    snapshot = await gpu.read_gpus(host, plan.smi, nvml=plan.nvml)
    return [f"GPUs ({snapshot.source or snapshot.status.name}): "
            + ("; ".join(f"{g.index}: {g.name}, {fmt(g.mem_total_mib, ',')} MiB, limit {fmt(g.power_limit_w)} W"
                         for g in snapshot.gpus) or snapshot.message), ""]


async def main_async(args) -> str:
    os.environ.update(NO_MULTICAST)
    os.environ["PYTHONUNBUFFERED"] = "1"
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    work = Path(tempfile.mkdtemp(prefix="trackside-multi-gpu-"))
    os.environ["TMUX_TMPDIR"] = str(work)  # our own tmux server, started with this environment
    os.environ.pop("TMUX", None)
    budget = Budget(args.budget_s)
    plan = smoke_plan(work) if args.smoke else gpu_plan(args.gpus)
    host = LocalHost(runs_root=str(work / "runs"))
    lines = header(plan, args.smoke) + await gpu_lines(host, plan)
    try:
        lines += await training_stages(host, plan, budget, work)
        lines += await kill_section(host, plan, budget)
    finally:
        subprocess.run(["tmux", "kill-server"], capture_output=True)  # our server only
        await host.close()
    return "\n".join(lines + ["", f"Work dir: {work}"]) + "\n"


async def training_stages(host, plan: Plan, budget: Budget, work: Path) -> list[str]:
    data_cmd = [sys.executable, "bench/random_data.py", *plan.data_args]
    lines: list[str] = []
    try:
        made = subprocess.run(data_cmd, cwd=REPO, capture_output=True, text=True, timeout=budget.left(180))
        lines += [f"Data: `{' '.join(data_cmd)}` → exit {made.returncode}: "
                 f"{((made.stdout or made.stderr).strip().splitlines() or [''])[-1]}", ""]
        if made.returncode == 0:
            one = TrainRun("1 GPU" if plan.device == "cuda" else "1 process",
                           [sys.executable, *plan.train(plan.steps, 2)],
                           {"CUDA_VISIBLE_DEVICES": "0"} if plan.device == "cuda" else {}, work / "one")
            many = TrainRun(f"{plan.gpus} GPUs" if plan.device == "cuda" else f"{plan.gpus} processes",
                            plan.torchrun(plan.steps, 1),
                            {"CUDA_VISIBLE_DEVICES": ",".join(map(str, range(plan.gpus)))} if plan.device == "cuda" else {},
                            work / "many")
            for run, name in ((one, "1"), (many, str(plan.gpus))):
                await train(host, plan, run, budget.left(150))
                keep(run.out / "metrics.jsonl", f"{name}-{plan.device}")
            lines += train_section(plan, one, many) + [""]
        return lines
    except Exception as error:  # noqa: BLE001 — the report says what failed; the kill stage still runs
        return lines + [f"**the training stages failed**: {type(error).__name__}: {error}", ""]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="CPU, gloo, the fake nvidia-smi: checks the script, not GPUs")
    parser.add_argument("--gpus", type=int, default=2, help="N for the torchrun runs (default 2)")
    parser.add_argument("--budget-s", type=float, default=400, help="time limit of the waits, all together (default 400)")
    args = parser.parse_args()
    report = asyncio.run(main_async(args))
    print(report)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "multi_gpu.md").write_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
