"""`trackside launch|runs|kill|relaunch`: JSON shapes, human output, exit codes."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from backends import gpu, runs
from tests.backends.test_kill import FAKE_SMI
from tests.backends.test_runs import PY, eventually, fake_trainer, tmux_dir, written  # noqa: F401 (fixtures)
from tui.commands.headless import main
from tui.commands.runs import show_runs

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def config(tmp_path, runs_root, tmux_dir):
    """A config with one local host named `box`, the fake trainer and the fake nvidia-smi."""
    path = tmp_path / "config.toml"
    train = fake_trainer(tmp_path)
    path.write_text(
        f"[hosts.box]\nruns_root = {json.dumps(runs_root)}\n"
        f"train_command = {json.dumps(train)}\nnvidia_smi = {json.dumps(FAKE_SMI)}\n"
    )
    return str(path)


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def cli_json(capsys, subcommand: str, *argv: str):
    code, out, err = cli(capsys, subcommand, "--json", *argv)
    assert code == 0, err
    return json.loads(out)


def test_launch_runs_kill_relaunch_json_shapes(capsys, config, runs_root):
    launched = cli_json(capsys, "launch", "--config", config, "--host", "box", "--", "trackside", "train", "--synthetic", "--ttt-steps", "3")
    assert set(launched) == {"run_id", "host", "session", "run_dir"}
    assert launched["host"] == "box" and launched["run_dir"] == f"{runs_root}/{launched['run_id']}"
    # `trackside train` ran as the host's train command, with --out set to the run dir.
    argv_file = Path(launched["run_dir"], "argv.json")
    subprocess.run(["tmux", "new-session", "-d", "-s", "foreign", "sleep", "60"], check=True)

    listed = cli_json(capsys, "runs", "--config", config)
    assert [r["run_id"] for r in listed] == [launched["run_id"], None]
    for run in listed:
        assert {"run_id", "session", "state", "params", "last_step", "last_loss", "pids"} <= set(run)
    assert listed[0]["state"] == "running" and listed[0]["params"] == {"ttt_steps": 3}
    assert listed[1]["session"] == "foreign" and len(listed[1]["pids"]) == 1

    relaunched = cli_json(capsys, "relaunch", launched["run_id"], "--config", config, "--set", "ttt_steps=5", "--set", "max_seq_len=16384")
    assert set(relaunched) == {"run_id", "host", "session", "run_dir", "parent"}
    assert relaunched["parent"] == launched["run_id"]
    child = next(r for r in cli_json(capsys, "runs", "--config", config) if r["run_id"] == relaunched["run_id"])
    assert child["params"] == {"ttt_steps": 5, "max_seq_len": 16384}

    report = cli_json(capsys, "kill", launched["run_id"], "--config", config, "--grace", "5")
    assert {"signalled", "survivors", "gpus", "released"} <= set(report)
    assert report["released"] is True and report["survivors"] == [] and len(report["signalled"]) == 2  # the trainer, the sh recording its status
    assert report["gpus"] == [{"index": 0, "before_mib": report["gpus"][0]["before_mib"], "after_mib": report["gpus"][0]["after_mib"]}]
    assert json.loads(written(argv_file))[-2:] == ["--out", launched["run_dir"]]


def test_human_output(capsys, config):
    code, out, _ = cli(capsys, "launch", "--config", config, "--session", "hello", "--", "sleep", "60")
    assert code == 0 and "in tmux session hello" in out
    code, out, _ = cli(capsys, "runs", "--config", config)
    assert code == 0 and out.splitlines()[0].split() == ["RUN", "SESSION", "STATE", "STEP", "LOSS", "TOK/S", "τ", "ETA", "PARAMS", "PIDS"]
    assert "hello" in out and "running" in out
    code, out, _ = cli(capsys, "kill", "hello", "--config", config)
    assert code == 0 and "SIGTERM to 2 process(es)" in out and "released: the run holds no GPU memory" in out


def test_kill_names_a_process_outside_the_run_that_holds_gpu_memory(capsys, config, tmp_path, monkeypatch):
    if gpu.nvml.library() is not None:
        pytest.skip("NVML answers on this machine: the CLI reads the real GPUs, not the fake nvidia-smi")
    bystander = subprocess.Popen([PY, "-c", "import time; time.sleep(60)"])
    try:
        procs = tmp_path / "gpu-procs.json"
        procs.write_text(json.dumps([{"pid": bystander.pid, "gpu": 1, "used_mib": 2048, "name": "python3"}]))
        monkeypatch.setenv("FAKE_NVIDIA_SMI_PROCS", str(procs))
        monkeypatch.setenv("FAKE_NVIDIA_SMI_GPUS", "2")
        for session in ("one", "two"):
            assert cli(capsys, "launch", "--config", config, "--session", session, "--", "sleep", "60")[0] == 0
        code, out, _ = cli(capsys, "kill", "one", "--config", config)
        assert code == 0
        assert f"held by a process outside the run: pid {bystander.pid} (python3) on GPU 1, 2,048 MiB — not touched" in out
        assert "released: the run holds no GPU memory" in out
        report = cli_json(capsys, "kill", "two", "--config", config)
        assert report["other_holders"] == [{"pid": bystander.pid, "gpu_index": 1, "used_mib": 2048, "name": "python3"}]
        assert report["released"] is True and bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_kill_on_a_host_without_gpus_says_so(capsys, config, tmp_path):
    no_gpu = tmp_path / "no-gpu.toml"
    no_gpu.write_text(Path(config).read_text().replace(FAKE_SMI, str(tmp_path / "absent-nvidia-smi")))
    assert cli(capsys, "launch", "--config", str(no_gpu), "--session", "cpu", "--", "sleep", "60")[0] == 0
    code, out, _ = cli(capsys, "kill", "cpu", "--config", str(no_gpu))
    assert code == 0 and "no GPU memory to verify" in out
    assert cli(capsys, "launch", "--config", str(no_gpu), "--session", "cpu2", "--", "sleep", "60")[0] == 0
    report = cli_json(capsys, "kill", "cpu2", "--config", str(no_gpu))
    assert report["released"] is None and report["gpu_status"] == "NO_SMI"  # nothing checked it: unverified, not true


HOSTILE_SETS = [
    "max_seq_len=8192; touch {pwned}",
    "max_seq_len=$(touch {pwned})",
    "max_seq_len=`touch {pwned}`",
    "max_seq_len=8192\ntouch {pwned}",
    "max_seq_len=8192' && touch '{pwned}",
    'max_seq_len="8192"',
]


@pytest.mark.parametrize("item", HOSTILE_SETS)
def test_hostile_set_values_exit_2_and_run_nothing(capsys, config, runs_root, tmp_path, item):
    pwned = tmp_path / "pwned"
    parent = cli_json(capsys, "launch", "--config", config, "--", "trackside", "train", "--synthetic")
    code, out, err = cli(capsys, "relaunch", parent["run_id"], "--config", config, "--set", item.format(pwned=pwned))
    assert code == 2 and out == ""
    assert err.startswith("trackside: --set max_seq_len:") and "Traceback" not in err
    assert sorted(os.listdir(runs_root)) == [parent["run_id"], "gpu"]  # nothing was launched (gpu/: the host's recorder)
    assert not pwned.exists()


@pytest.mark.parametrize(
    "argv, names",
    [
        (["kill", "x", "--grace", "-1"], "--grace"),
        (["kill", "x", "--grace", "soon"], "--grace"),
        (["launch", "--session", "a:b", "--", "true"], "--session"),
        (["launch", "sleep", "1"], "after --"),
        (["launch", "--"], "empty"),
        (["runs", "--host", "nope"], "--host"),
        (["relaunch", "../../etc", "--set", "ttt_steps=3"], "RUN"),
        (["relaunch", "20260101-0000-abcd", "--set", "colour=red"], "--set colour"),
        (["relaunch", "20260101-0000-abcd", "--set", "ttt_steps=99"], "--set ttt_steps"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_bad_arguments_exit_2_naming_the_flag(capsys, config, argv, names):
    code, out, err = cli(capsys, argv[0], "--config", config, *argv[1:])
    assert code == 2 and out == "" and names in err and "Traceback" not in err


def test_bad_config_exits_2_naming_the_key(capsys, tmp_path, tmux_dir):
    bad = tmp_path / "bad.toml"
    bad.write_text("[hosts.box]\nport = 'ssh'\n")
    code, _, err = cli(capsys, "runs", "--config", str(bad))
    assert code == 2 and "hosts.box.port" in err


def test_other_failures_exit_1_with_a_message(capsys, config):
    code, _, err = cli(capsys, "kill", "nope", "--config", config)
    assert code == 1 and err.strip() == "trackside: no run or tmux session 'nope' on box"
    code, _, err = cli(capsys, "relaunch", "20260101-0000-abcd", "--config", config)
    assert code == 1 and "no run 20260101-0000-abcd on box" in err
    cli_json(capsys, "launch", "--config", config, "--session", "taken", "--", "sleep", "60")
    code, _, err = cli(capsys, "launch", "--config", config, "--session", "taken", "--", "sleep", "60")
    assert code == 1 and "duplicate session" in err


def test_the_installed_command_routes_here(config, tmp_path):
    """The console script end to end: the literal argv arrives whole, exit codes hold."""
    trackside = str(REPO / ".venv" / "bin" / "trackside")
    pwned = tmp_path / "pwned"
    out = tmp_path / "argv.json"
    hostile = [f"8192; touch {pwned}", "$(id)", "a\nb", "'"]
    script = "import json,sys; open(sys.argv[1],'w').write(json.dumps(sys.argv[2:]))"
    done = subprocess.run([trackside, "launch", "--config", config, "--json", "--", PY, "-c", script, str(out), *hostile],
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert set(json.loads(done.stdout)) == {"run_id", "host", "session", "run_dir"}
    assert json.loads(asyncio.run(eventually(lambda: written(out)))) == hostile and not pwned.exists()
    failed = subprocess.run([trackside, "kill", "nope", "--config", config], capture_output=True, text=True)
    assert failed.returncode == 1 and "Traceback" not in failed.stderr


def test_a_clean_stop_whose_launcher_exits_1_reads_as_a_clean_stop():
    stopped = runs.RunInfo("r1", "s1", "local", runs.RunPhase.EXITED, 1, end_status="stopped")
    failed = runs.RunInfo("r2", "s2", "local", runs.RunPhase.EXITED, 1, end_status="failed")
    shown = show_runs([stopped, failed])
    # The fleet's words: the trainer's own clean stop, the launcher's code a footnote.
    assert "stopped (launcher exit 1)" in shown and "failed (1)" in shown


def test_runs_shows_what_the_fleet_shows_of_a_run():
    """tokens/s, a DFlash run's τ and the ETA are in the dashboard's fleet: `trackside runs`
    said none of them."""
    dflash = runs.RunInfo("r1", "s1", "local", runs.RunPhase.RUNNING, last_step=240, last_loss=2.807,
                          tokens_per_s=37449.2, tau=2.5714, eta_s=27130.0, params={"max_anchors": 1024})
    eagle = runs.RunInfo("r2", "s2", "local", runs.RunPhase.EXITED, 0, last_step=9, tokens_per_s=812.0, eta_s=5.0)
    header, first, second, window = show_runs([dflash, eagle]).splitlines()
    assert window == "TOK/S and ETA: over each run's last 60 s of steps"  # backends/pace.py
    at = header.index("TOK/S")  # the columns are aligned: read each row from there
    assert header[at:].split()[:3] == ["TOK/S", "τ", "ETA"]
    assert first[at:].split()[:3] == ["37,449", "2.57", "7h32m"]
    assert second[at:].split()[:3] == ["812", "-", "-"]  # no τ for EAGLE-3; an ended run has no ETA


def test_gpus_reads_what_the_gpu_panel_shows(capsys, config, tmp_path, monkeypatch):
    """The dashboard's GPU panel (power against its limit, memory, the processes holding
    it) had no headless command. Here through the fake nvidia-smi (this machine has no GPU;
    the real one is read by the GPU tests)."""
    procs = tmp_path / "procs.json"
    procs.write_text(json.dumps([{"pid": os.getpid(), "gpu": 1, "used_mib": 5000, "name": "python3"}]))
    monkeypatch.setenv("FAKE_NVIDIA_SMI_PROCS", str(procs))
    monkeypatch.setenv("FAKE_NVIDIA_SMI_GPUS", "2")
    code, out, _ = cli(capsys, "gpus", "--config", config)
    header, *rows = out.splitlines()
    assert code == 0 and header.split() == ["GPU", "NAME", "POWER", "MEMORY", "UTIL", "TEMP"]
    assert rows[0].split()[:6] == ["0", "NVIDIA", "H200", "78/700", "W", "0.0/140.4"]
    assert rows[1].split()[:6] == ["1", "NVIDIA", "H200", "78/700", "W", "4.9/140.4"]  # idle + the process's
    assert rows[2:] == [f"PID {os.getpid()} (python3) holds 5000 MiB on GPU 1", "read by nvidia-smi"]
    doc = cli_json(capsys, "gpus", "--config", config)
    assert doc["status"] == "ok" and [g["index"] for g in doc["gpus"]] == [0, 1]
    assert doc["gpus"][0]["power_limit_w"] == 700.0 and doc["gpus"][0]["mem_total_mib"] == 143771

    monkeypatch.setenv("FAKE_NVIDIA_SMI_FAIL", "driver")
    code, out, err = cli(capsys, "gpus", "--config", config)
    assert code == 1 and out == "" and err.startswith("trackside: box: driver error:") and len(err.splitlines()) == 1
    monkeypatch.setenv("FAKE_NVIDIA_SMI_FAIL", "no-devices")
    assert cli(capsys, "gpus", "--config", config)[:2] == (0, "box: no GPU: nvidia-smi found no devices\n")


@pytest.mark.gpu
def test_gpus_on_a_real_gpu_reads_nvml_as_nvidia_smi_does(capsys, tmp_path, tmux_dir):
    """`trackside gpus` on this machine's GPUs (NVML in process) against nvidia-smi's own
    CSV: the same cards, limits and totals."""
    config = tmp_path / "config.toml"
    config.write_text(f"[hosts.here]\nruns_root = {json.dumps(str(tmp_path / 'runs'))}\n")
    doc = cli_json(capsys, "gpus", "--config", str(config))
    smi = subprocess.run(["nvidia-smi", "--query-gpu=index,power.limit,memory.total", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True).stdout
    expected = [(int(i), float(p), int(m)) for i, p, m in (line.split(", ") for line in smi.splitlines())]
    assert doc["status"] == "ok" and doc["source"] == "nvml"
    assert [(g["index"], g["power_limit_w"], g["mem_total_mib"]) for g in doc["gpus"]] == expected
    code, out, _ = cli(capsys, "gpus", "--config", str(config))
    assert code == 0 and out.splitlines()[0].split()[0] == "GPU" and out.splitlines()[-1] == "read by nvml"


def test_each_error_is_said_once_in_one_line(capsys, config):
    code, _, err = cli(capsys, "runs", "--bogus", "--config", config)
    assert code == 2 and err.strip() == "trackside: unrecognized arguments: --bogus"  # not "trackside: trackside: …"
    # "a:b" is no name a tmux session can have (':' picks a window); "a b" may be one.
    for target in ("", "a:b", "-x"):
        code, _, err = cli(capsys, "kill", target, "--config", config)
        assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err and "no mouse" not in err, err
    code, _, err = cli(capsys, "kill", "a b", "--config", config)
    assert (code, err.strip()) == (1, "trackside: no run or tmux session 'a b' on box")


@pytest.mark.parametrize("item, said", [
    ("epochs=2", "trackside: epochs: not with steps"),  # the child would die: --epochs not allowed with --steps
    ("block_size=16", "trackside: block_size: DFlash's; this run trains EAGLE-3"),  # --block-size needs --drafter dflash
    ("checkpoint_ttt=5", "trackside: checkpoint_ttt: must be ≤ ttt_steps 3"),
    ("lr=1e9", "trackside: --set lr: must be ≤ 1"),
])
def test_a_relaunch_the_trainer_would_refuse_exits_2_and_launches_nothing(capsys, config, runs_root, item, said):
    parent = cli_json(capsys, "launch", "--config", config, "--", "trackside", "train", "--synthetic", "--steps", "5", "--ttt-steps", "3")
    code, out, err = cli(capsys, "relaunch", parent["run_id"], "--config", config, "--set", item)
    assert code == 2 and out == "" and err.strip().startswith(said), err
    assert sorted(os.listdir(runs_root)) == [parent["run_id"], "gpu"]  # nothing was launched (gpu/: the host's recorder)


def test_runs_reads_a_launched_programs_console_as_the_screen_does(capsys, config):
    """A program launched with `launch --` writes no metrics.jsonl: its step and loss come
    from its console.log, in the listing as on its run screen (it showed `- -`)."""
    launched = cli_json(capsys, "launch", "--config", config, "--", "sh", "-c", "echo step=1 loss=2.5; echo step=2 loss=2.25; sleep 60")

    deadline = time.monotonic() + 10
    while True:
        [run] = [r for r in cli_json(capsys, "runs", "--config", config) if r["run_id"] == launched["run_id"]]
        if run["last_step"] == 2 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert (run["last_step"], run["last_loss"], run["status"]) == (2, 2.25, "running")
    code, table, _ = cli(capsys, "runs", "--config", config)
    [row] = [line for line in table.splitlines() if line.startswith(launched["run_id"])]
    assert row.split()[3:5] == ["2", "2.25"]
