"""`trackside kill` of a real trainer: its GPU is free when its processes are gone, which is
before its checkpoint is durable (a writer process of its own writes it, and the kill
leaves that writer alone); the report gives both times, and a run that is not our trainer
says its checkpoint was not waited for."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from backends import runs
from tests.backends.test_kill import FAKE_SMI, SAVES_ON_TERM, gpu_procs, ready_pids  # noqa: F401 (fixtures)
from tests.backends.test_runs import PY, TRAIN, eventually, host, tmux_dir, written  # noqa: F401 (fixtures)
from tests.waiting import HANG_S, trainer_started
from tui.commands.headless import main


def events(run_dir: str) -> list[dict]:
    return [json.loads(line) for line in written(Path(run_dir, "metrics.jsonl")).splitlines() if line.endswith("}")]


def config(tmp_path: Path, runs_root: str) -> str:
    path = tmp_path / "config.toml"
    path.write_text(f"[hosts.box]\nruns_root = {json.dumps(runs_root)}\nnvidia_smi = {json.dumps(FAKE_SMI)}\n")
    return str(path)


async def started(host) -> runs.RunInfo:
    """A trainer launched and three steps in: its start event waited for first, up to
    HANG_S (the launch stops looking after its own minute: a torch import under load)."""
    info = await runs.launch(host, [*TRAIN, "--steps", "100000", "--save-every", "0"])
    await eventually(lambda: trainer_started(info.run_dir), HANG_S)
    await eventually(lambda: sum(e["event"] == "step" for e in events(info.run_dir)) >= 3, 60)
    return info


async def kill_cli(capsys, tmp_path, runs_root, *argv: str) -> tuple[int, str]:
    code = await asyncio.to_thread(main, ["kill", *argv, "--config", config(tmp_path, runs_root), "--host", "box", "--grace", "20"])
    out, err = capsys.readouterr()
    return code, out + err


async def test_kill_of_a_trainer_reports_the_gpu_released_then_the_checkpoint_durable(host, gpu_procs, tmp_path, runs_root, capsys):
    info = await started(host)
    pane = json.loads(written(Path(info.run_dir, "manifest.json")))["pane_pid"]
    trainer = int(Path(f"/proc/{pane}/task/{pane}/children").read_text().split()[0])
    gpu_procs({trainer: (0, 30000)})

    code, said = await kill_cli(capsys, tmp_path, runs_root, info.run_id)
    assert code == 0, said
    after = events(info.run_dir)
    stopped_at = max(e["step"] for e in after if e["event"] == "step")
    assert f"checkpoint step {stopped_at} durable" in said and "GPU released" in said, said
    assert [e["event"] for e in after[-3:] if e["event"] != "end"] == ["staged", "checkpoint"]
    assert Path(info.run_dir, "checkpoints", f"step-{stopped_at}").is_dir()

    code, said = await kill_cli(capsys, tmp_path, runs_root, "--json", info.run_id)
    assert code == 1 and "already ended" in said  # its writer is no process of the run


async def test_kill_json_gives_both_times_and_not_waited_for_another_program(host, gpu_procs, tmp_path, runs_root, capsys):
    info = await started(host)
    code, out = await kill_cli(capsys, tmp_path, runs_root, "--json", info.run_id)
    report = json.loads(out)
    assert code == 0 and report["checkpoint"] == "durable"
    assert 0 < report["gpu_released_s"] <= report["checkpoint_durable_s"], report

    other = await runs.launch(host, [PY, "-c", SAVES_ON_TERM])
    await ready_pids(other)
    code, out = await kill_cli(capsys, tmp_path, runs_root, "--json", other.run_id)
    report = json.loads(out)
    assert code == 0 and report["checkpoint"] is None and report["checkpoint_durable_s"] is None
    assert report["gpu_released_s"] is not None
