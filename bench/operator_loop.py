"""The operator's loop on a GPU, as the dashboard drives it: a run trains beside a
bystander holding GPU memory; `R` stops it and relaunches it with a new max_seq_len, the
new trainer started as the SIGTERM goes out (backends.kill.kill_run and
backends.relaunch.relaunch, as the app calls them), its checkpoint made durable meanwhile;
then, through the CLI, `trackside kill` of the child and `trackside relaunch --set
max_seq_len=N --resume`, which must resume at the child's last step; then `R` with `c` on
that run (continuing from the checkpoint its stop saves, at yet another length). Both
drafters.

    PYTHONPATH=$PWD python3 bench/operator_loop.py --drafter eagle3     # llama3-8b 8192 x TTT 5
    PYTHONPATH=$PWD python3 bench/operator_loop.py --drafter dflash     # qwen3-8b 8192, block 16, 512 anchors
    .venv/bin/python bench/operator_loop.py --drafter eagle3 --smoke    # the same flow on the CPU, tiny

Times are wall clock, from the kill's start: the GPU released and the checkpoint durable
(the kill's report), the new run's `start` and first `step` events. Each resume says where
its state came from (`resume_source`: "ram", the stopped run's writer still writing, or
"disk"; its `startup_s` has the seconds of the resume, and of a disk's its wait for the
writer, `resume_wait`). The first launch's own
first step is reported too: on a box whose caches are cold it is the fresh-box figure.
Prints one JSON document; with $OUT set, writes it there too.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CLI = ["-c", "import sys; from tui.cli import main; sys.exit(main())"]

# (preset, the run's flags, R's new max_seq_len, the resumed relaunch's, R-with-c's)
CELLS = {
    ("eagle3", False): ("llama3-8b", ["--max-seq-len", "8192", "--ttt-steps", "5"], 12288, 10240, 11264),
    ("dflash", False): ("qwen3-8b", ["--drafter", "dflash", "--max-seq-len", "8192", "--block-size", "16",
                                     "--max-anchors", "512"], 12288, 10240, 11264),
    ("eagle3", True): ("tiny", ["--max-seq-len", "256", "--ttt-steps", "2"], 384, 320, 352),
    ("dflash", True): ("tiny", ["--drafter", "dflash", "--max-seq-len", "256", "--block-size", "4",
                                "--max-anchors", "8"], 384, 320, 352),
}
WARM_STEPS = 10  # steps the first run takes before it is killed


def cli(config: Path, *args: str, timeout: float = 300) -> dict:
    command, *rest = args  # the options before the rest: launch's command follows `--`
    result = subprocess.run([sys.executable, *CLI, command, "--config", str(config), "--json", *rest], cwd=REPO,
                            capture_output=True, text=True, timeout=timeout)  # fmt: skip
    if result.returncode:
        raise SystemExit(f"trackside {' '.join(args)} exited {result.returncode}: {result.stderr.strip()[-800:]}")
    return json.loads(result.stdout)


def events(run_dir: str) -> list[dict]:
    try:
        lines = Path(run_dir, "metrics.jsonl").read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        try:
            found.append(json.loads(line))
        except ValueError:
            pass  # the line being written
    return found


def wait_for(run_dir: str, what, timeout: float, label: str, *, ended: bool = False) -> list[dict]:
    """The run's events once `what` holds of them; an error if it ended first (unless
    `ended`: what is waited for comes after its end)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = events(run_dir)
        if what(seen):
            return seen
        if not ended and any(e.get("event") == "end" for e in seen):
            raise SystemExit(f"{label}: the run ended first: {seen[-1]}")
        time.sleep(0.05)
    raise SystemExit(f"{label}: not within {timeout:.0f}s ({run_dir})")


def stop_ready(run_dir: str, timeout: float = 300) -> str:
    """The trainer's line saying whether its RAM for a stop is ready (training/mirror.py),
    once it is said: a run killed before that would take the slower way."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in Path(run_dir, "console.log").read_text(errors="replace").splitlines():
            if line.startswith("train: for a stop,"):
                return line
        time.sleep(0.1)
    raise SystemExit(f"the trainer said nothing of its RAM for a stop within {timeout:.0f}s ({run_dir})")


def steps(seen: list[dict]) -> list[dict]:
    return [e for e in seen if e.get("event") == "step"]


def first(seen: list[dict], kind: str) -> dict:
    return next(e for e in seen if e.get("event") == kind)


def bystander(smoke: bool) -> subprocess.Popen | None:
    """A process outside the run holding 8.5 GiB of the GPU: the kill must leave it be."""
    if smoke:
        return None
    code = ("import sys, time, torch; x = torch.empty(int(8.5 * 2**30), dtype=torch.uint8, device='cuda'); "
            "print('held', flush=True); time.sleep(3600)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


async def r_key(runs_root: Path, run_id: str, max_seq_len: int, train: list[str], resume: bool = False) -> dict:
    """R as the dashboard does it (tui/run_actions.py): the kill, and the relaunch (afresh,
    or with `resume` from the checkpoint the stop saves, with the edit) started the moment
    the SIGTERM is out, its trainer waiting for the stopped run's processes to end (and a
    resuming one for their writer) before it touches the GPU."""
    from backends import kill
    from backends.hosts import LocalHost
    from backends.relaunch import Relaunch, relaunch

    host = LocalHost("local", runs_root=str(runs_root))
    relaunched: list[asyncio.Task] = []
    stopped_at = time.time()
    report = await kill.kill_run(host, run_id, grace_s=120, on_signalled=lambda pids: relaunched.append(asyncio.ensure_future(
        relaunch(Relaunch(host.name, run_id, {"max_seq_len": max_seq_len}, resume, after_pids=tuple(pids)),
                 {host.name: host}, {host.name: train}))))  # fmt: skip
    child, _ = await relaunched[0]
    return {"stopped_at": stopped_at, "report": report.to_json(), "child": child.to_json()}


def loop(drafter: str, smoke: bool, work: Path) -> dict:
    preset, flags, r_length, resumed_length, rc_length = CELLS[drafter, smoke]
    device = "cpu" if smoke else "cuda"
    data = work / f"data-{drafter}-{preset}"
    if smoke:
        source = ["--synthetic"]
    else:
        maker = [sys.executable, "bench/random_data.py", "--drafter", drafter, "--preset", preset, "--out", str(data)]
        if drafter == "eagle3":
            maker += ["--samples", "40", "--length", "2048"]
        subprocess.run(maker, cwd=REPO, check=True, capture_output=True, timeout=300)
        source = ["--data", str(data)]
    config = work / f"config-{drafter}.toml"
    train = [sys.executable, "-m", "training", "train"]
    config.write_text(f"[hosts.local]\nruns_root = {json.dumps(str(work / 'runs'))}\n"
                      f"train_command = {json.dumps(train)}\n")  # fmt: skip
    argv = [*train, *source, "--preset", preset, *flags, "--steps", "100000", "--save-every", "0",
            "--device", device]  # fmt: skip
    held = bystander(smoke)
    try:
        launched_at = time.time()
        parent = cli(config, "launch", "--", *argv)
        seen = wait_for(parent["run_dir"], lambda s: len(steps(s)) >= WARM_STEPS, 600, "the first run's steps")
        parent_ready = stop_ready(parent["run_dir"])
        # R: kill, and relaunch afresh at a new length once the GPU is free.
        r = asyncio.run(r_key(work / "runs", parent["run_id"], r_length, train))
        child, stopped_at = r["child"], r["stopped_at"]
        seen_child = wait_for(child["run_dir"], lambda s: len(steps(s)) >= WARM_STEPS, 600, "R's run's steps")
        child_ready = stop_ready(child["run_dir"])
        # The CLI: kill the child, relaunch it at another new length from its checkpoint.
        killed_at = time.time()
        report = cli(config, "kill", child["run_id"], "--grace", "120")
        kill_s = time.time() - killed_at
        last_step = steps(events(child["run_dir"]))[-1]["step"]
        relaunched_at = time.time()
        resumed = cli(config, "relaunch", child["run_id"], "--set", f"max_seq_len={resumed_length}", "--resume")
        relaunch_s = time.time() - relaunched_at
        seen_resumed = wait_for(resumed["run_dir"], lambda s: len(steps(s)) >= 1, 600, "the resumed run's first step")
        # R with c on that run: its relaunch continues from the checkpoint the stop saves.
        wait_for(resumed["run_dir"], lambda s: len(steps(s)) >= WARM_STEPS, 600, "the resumed run's steps")
        stop_ready(resumed["run_dir"])
        rc = asyncio.run(r_key(work / "runs", resumed["run_id"], rc_length, train, resume=True))
        seen_rc = wait_for(rc["child"]["run_dir"], lambda s: len(steps(s)) >= 1, 600, "R-with-c's run's first step")
        rc_stopped = steps(events(resumed["run_dir"]))[-1]["step"]
        cli(config, "kill", rc["child"]["run_id"], "--grace", "120")
        bystander_alive = held is None or held.poll() is None
    finally:
        if held is not None:
            held.kill()
        # A run left behind by a failure (a run that ended first, a timeout): its session
        # goes too, whatever state it is in.
        for manifest in (work / "runs").glob("*/manifest.json"):
            session = json.loads(manifest.read_text())["session"]
            subprocess.run(["tmux", "kill-session", "-t", f"={session}"], capture_output=True)
    r_start, r_step = first(seen_child, "start"), steps(seen_child)[0]
    start, step = first(seen_resumed, "start"), steps(seen_resumed)[0]
    rc_start, rc_step = first(seen_rc, "start"), steps(seen_rc)[0]
    said = Path(child["run_dir"], "console.log").read_text(errors="replace").splitlines()
    return {
        "drafter": drafter, "preset": preset, "argv": argv,
        "first_run": {"launch_to_start_s": first(seen, "start")["time"] - launched_at,
                      "launch_to_first_step_s": steps(seen)[0]["time"] - launched_at},
        "R": {"max_seq_len": r_length, "gpu_released_s": r["report"]["gpu_released_s"],
              "checkpoint": r["report"]["checkpoint"], "checkpoint_durable_s": r["report"]["checkpoint_durable_s"],
              "process_started_s": r_start["process_started"] - stopped_at, "startup_s": r_start["startup_s"],
              "to_start_s": r_start["time"] - stopped_at, "to_first_step_s": r_step["time"] - stopped_at,
              "stopped_run_ready": parent_ready},
        "kill": {"command_s": kill_s, "gpu_released_s": report["gpu_released_s"], "checkpoint": report["checkpoint"],
                 "checkpoint_step": report["checkpoint_step"], "checkpoint_durable_s": report["checkpoint_durable_s"],
                 "bystander": report["other_holders"], "gpus": report["gpus"]},
        "stopped_at_step": last_step,
        "stopped_run_ready": child_ready,
        "stopped_run_said": [line for line in said if line.startswith("train:")][-3:],
        "resumed": {"max_seq_len": resumed_length, "resumed_from_step": start["config"].get("resumed_from_step"),
                    "first_step": step["step"], "command_s": relaunch_s, "startup_s": start["startup_s"],
                    "resume_source": start.get("resume_source"),
                    "to_start_s": start["time"] - relaunched_at, "to_first_step_s": step["time"] - relaunched_at},
        "R_resume": {"max_seq_len": rc_length, "stopped_at_step": rc_stopped,
                     "resumed_from_step": rc_start["config"].get("resumed_from_step"), "first_step": rc_step["step"],
                     "gpu_released_s": rc["report"]["gpu_released_s"], "checkpoint_durable_s": rc["report"]["checkpoint_durable_s"],
                     "process_started_s": rc_start["process_started"] - rc["stopped_at"], "startup_s": rc_start["startup_s"],
                     "resume_source": rc_start.get("resume_source"),
                     "to_start_s": rc_start["time"] - rc["stopped_at"], "to_first_step_s": rc_step["time"] - rc["stopped_at"]},
        "bystander_untouched": bystander_alive,
    }  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drafter", choices=["eagle3", "dflash"], default="eagle3")
    parser.add_argument("--smoke", action="store_true", help="on the CPU, the tiny preset")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="operator-loop-") as work:
        result = loop(args.drafter, args.smoke, Path(work))
    text = json.dumps(result, indent=1)
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], f"operator_loop_{args.drafter}.json").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
