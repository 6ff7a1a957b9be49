"""`trackside plot` on real runs: a short synthetic training and the relaunch of it with
a deeper TTT, in tmux on a private server, read locally and over the test sshd; and a
session trackside did not launch, read from its pane."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from backends import runs
from backends.hosts import LocalHost
from backends.relaunch import Relaunch, relaunch
from scripts.local_box import end_tmux_server
from tests.waiting import niced
from tui.cli import main

TRAIN = niced([sys.executable, "-m", "training", "train", "--synthetic", "--steps", "12", "--max-seq-len", "128", "--ttt-steps", "2"])
# A program of someone else's: it prints its loss, and stays in its pane to be read.
FOREIGN = [sys.executable, "-c", "import time\nfor s in range(1, 31): print(f'step {s} loss={4 - s / 10:.2f}', flush=True)\ntime.sleep(60)"]


@dataclass
class Fleet:
    root: str
    tmux_dir: str
    parent: runs.RunInfo
    child: runs.RunInfo
    config: Path


async def _ended(host: LocalHost, run_id: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        listed = {r.run_id: r for r in await runs.list_runs(host)}
        if listed[run_id].state is not runs.RunPhase.RUNNING:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"run {run_id} still running after {timeout}s")


async def _parent_and_child(host: LocalHost) -> tuple[runs.RunInfo, runs.RunInfo]:
    parent = await runs.launch(host, TRAIN)
    # Relaunched at once, not after its parent: the lineage is the manifest's, and the two
    # short trainings overlap rather than queue.
    child, _ = await relaunch(Relaunch(host.name, parent.run_id, {"ttt_steps": 3}), {host.name: host})
    await runs.launch(host, FOREIGN, session="printer")  # ours, but no metrics.jsonl: its console.log
    subprocess.run(["tmux", "new-session", "-d", "-s", "their-sft", "--", *FOREIGN], check=True)  # not ours
    await _ended(host, parent.run_id)
    await _ended(host, child.run_id)
    return parent, child


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """Two real runs, parent and child, and a session printing losses; one tmux server
    of the module's own (TMUX_TMPDIR), which the in-process commands reach too."""
    tmux_dir = tempfile.mkdtemp(prefix="ts-plot-", dir="/tmp")  # tmux's socket path stays short
    base = tmp_path_factory.mktemp("plot")
    root = str(base / "runs")
    config = base / "config.toml"
    config.write_text(f'[hosts.box]\nruns_root = "{root}"\n')
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TMUX_TMPDIR", tmux_dir)
        env.delenv("TMUX", raising=False)
        try:
            parent, child = asyncio.run(_parent_and_child(LocalHost("box", runs_root=root)))
            yield Fleet(root, tmux_dir, parent, child, config)
        finally:
            end_tmux_server("tmux")  # the module's server only
            shutil.rmtree(tmux_dir, ignore_errors=True)


def plot(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["plot", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def chart_cells(out: str) -> str:
    """What is drawn inside the chart's frame, legend included."""
    return "".join(line.split("│")[1] for line in out.splitlines() if line.count("│") == 2)


def check_chart(out: str, fleet: Fleet) -> None:
    assert fleet.parent.run_id in out
    assert f"{fleet.child.run_id} (ttt_steps 2 → 3)" in out  # the child, named by its tweak
    cells = chart_cells(out)
    # Without a terminal each run has its own marker: both curves are drawn.
    assert cells.count("•") > 10 and cells.count("+") > 10, out
    assert "loss against step" in out


def test_plot_draws_a_parent_and_its_child(fleet, capsys):
    code, out, err = plot(capsys, fleet.parent.run_id, fleet.child.run_id, "--config", str(fleet.config), "--width", "90", "--height", "22")
    assert code == 0, err
    check_chart(out, fleet)
    assert max(map(len, out.splitlines())) <= 90 and len(out.splitlines()) <= 22


def test_json_is_the_series_tokens_seen_summed_from_the_metrics(fleet, capsys):
    code, out, err = plot(capsys, fleet.parent.run_id, fleet.child.run_id, "--config", str(fleet.config), "--json", "--x", "tokens", "--metric", "acc")
    assert code == 0, err
    parent, child = json.loads(out)
    assert (parent["run"], child["run"], child["parent"]) == (fleet.parent.run_id, fleet.child.run_id, fleet.parent.run_id)
    assert child["params"]["ttt_steps"] == 3 and (child["metric"], child["x"]) == ("acc", "tokens")
    steps = [json.loads(line) for line in Path(fleet.parent.run_dir, "metrics.jsonl").read_text().splitlines()]
    steps = [e for e in steps if e["event"] == "step"]
    seen = [sum(e["tokens"] for e in steps[: i + 1]) for i in range(len(steps))]
    assert parent["points"] == [[x, e["acc_ttt"][0]] for x, e in zip(seen, steps)]
    assert len(steps) == 12


def test_a_session_plots_from_its_pane_and_a_run_without_metrics_from_its_console(fleet, capsys):
    code, out, err = plot(capsys, "their-sft", fleet.parent.run_id, "--config", str(fleet.config), "--json")
    assert code == 0, err
    foreign, _ = json.loads(out)
    assert foreign["run"] == "their-sft" and foreign["points"][:2] == [[1, 3.9], [2, 3.8]] and len(foreign["points"]) == 30
    code, out, err = plot(capsys, "printer", "--config", str(fleet.config), "--json")
    (printer,) = json.loads(out)
    assert runs.RUN_ID.fullmatch(printer["run"]) and printer["points"][-1] == [30, 1.0]
    code, out, err = plot(capsys, "their-sft", "--config", str(fleet.config), "--x", "tokens")
    assert code == 2 and err.strip() == "trackside plot: their-sft on box never logged loss against tokens (it logged loss)"


@pytest.mark.parametrize(
    "argv, code, said",
    [
        (["20261129-0930-dead"], 1, "no run 20261129-0930-dead on box"),
        (["no-such-session"], 1, "no run or tmux session 'no-such-session' on box"),
        (["{parent}", "--metric", "perplexity"], 2, "{parent} on box never logged perplexity"),
        (["{parent}", "--x", "epoch"], 2, "--x: invalid choice: 'epoch'"),
        (["{parent}", "--width", "3"], 2, "--width"),
        (["a:b"], 2, "RUN 'a:b' is neither a run id"),
        (["{parent}", "--host", "nowhere"], 2, "nowhere"),
    ],
)
def test_bad_input_is_one_line_and_an_exit_status(fleet, capsys, argv, code, said):
    argv = [a.format(parent=fleet.parent.run_id) for a in argv]
    got, out, err = plot(capsys, *argv, "--config", str(fleet.config))
    assert (got, out) == (code, ""), err
    assert len(err.strip().splitlines()) == 1 and said.format(parent=fleet.parent.run_id) in err


def test_plot_over_ssh_by_session_name(fleet, sshd, capsys, tmp_path):
    """The same runs read through the test sshd, the child named by its tmux session."""
    if not sshd.running:
        sshd.start()
    config = tmp_path / "ssh.toml"
    config.write_text(
        f'[hosts.remote]\naddress = "{sshd.address}"\nport = {sshd.port}\nuser = "{sshd.user}"\n'
        f'known_hosts = "{sshd.known_hosts}"\nidentity_file = "{sshd.client_key}"\nruns_root = "{fleet.root}"\n'
        f'prefix = ["env", "TMUX_TMPDIR={fleet.tmux_dir}"]\n'
    )
    code, out, err = plot(capsys, fleet.parent.run_id, fleet.child.session, "--config", str(config), "--width", "90", "--height", "22")
    assert code == 0, err
    check_chart(out, fleet)


SHORT, LONG = "20261129-0930-aaaa", "20261129-1410-bbbb"


@pytest.fixture
def short_and_long(tmp_path) -> Path:
    """A 206-step run that stopped high beside a 4,834-step one, as run dirs (manifest,
    metrics.jsonl) on this machine; the config naming their runs root."""
    for run_id, steps, first, last in [(SHORT, 206, 4.6, 4.3), (LONG, 4834, 4.0, 1.0)]:
        directory = tmp_path / "runs" / run_id
        directory.mkdir(parents=True)
        (directory / "manifest.json").write_text(json.dumps({"run_id": run_id, "run_dir": str(directory)}))
        events = [{"event": "step", "step": s, "loss": first - (first - last) * (s / steps) ** 0.5, "lr": 3e-4 * s / steps} for s in range(1, steps + 1)]
        (directory / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    config = tmp_path / "config.toml"
    config.write_text(f'[hosts.box]\nruns_root = "{tmp_path / "runs"}"\n')
    return config


def test_the_legend_hides_no_curve(short_and_long, capsys):
    """The short run's curve lies in the top left corner, where a legend inside the frame
    is drawn: the legend is outside the frame, each run by its marker."""
    code, out, err = plot(capsys, SHORT, LONG, "--config", str(short_and_long), "--width", "100", "--height", "24")
    assert code == 0, err
    cells = chart_cells(out)
    assert SHORT not in cells and LONG not in cells, out
    assert cells.count("•") >= 4, out  # 206 of 4,834 steps: the first 4 of 94 columns
    legend = [line.strip() for line in out.splitlines() if "│" not in line and ("aaaa" in line or "bbbb" in line)]
    assert legend == [f"•• {SHORT}", f"++ {LONG}"], out
    assert len(out.splitlines()) <= 24


def test_each_metric_asked_is_plotted(short_and_long, capsys):
    code, out, err = plot(capsys, SHORT, LONG, "--config", str(short_and_long), "--metric", "loss", "--metric", "lr", "--width", "100", "--height", "30")
    assert code == 0, err
    assert "loss against step" in out and "lr against step" in out, out
    assert len(out.splitlines()) <= 30
    code, out, err = plot(capsys, SHORT, LONG, "--config", str(short_and_long), "--metric", "loss", "--metric", "lr", "--height", "16")
    assert (code, out) == (2, "") and err.strip().startswith("trackside plot: this chart needs --height 17 or more")
    code, out, err = plot(capsys, SHORT, LONG, "--config", str(short_and_long), "--metric", "loss", "--metric", "lr", "--json")
    assert code == 0, err
    assert [(doc["run"], doc["metric"]) for doc in json.loads(out)] == [(SHORT, "loss"), (SHORT, "lr"), (LONG, "loss"), (LONG, "lr")]
    code, out, err = plot(capsys, SHORT, "--config", str(short_and_long), "--metric", "loss", "--metric", "perplexity")
    assert code == 2 and err.strip().startswith(f"trackside plot: {SHORT} on box never logged perplexity")


def test_a_run_that_cannot_be_read_is_one_line_naming_it(tmp_path, capsys):
    """No manifest is no such run; a manifest or a metrics.jsonl that cannot be read (a
    directory in its place: the suite may run as root, who reads any file) is said so,
    never in cat's words, and exits 1."""
    root = tmp_path / "runs"
    gone, unreadable, no_metrics = "20261129-0930-dead", "20261129-0930-b1b2", "20261129-0930-c1b2"
    (root / unreadable / "manifest.json").mkdir(parents=True)
    (root / no_metrics).mkdir()
    (root / no_metrics / "manifest.json").write_text("{}")
    (root / no_metrics / "metrics.jsonl").mkdir()
    config = tmp_path / "config.toml"
    config.write_text(f'[hosts.box]\nruns_root = "{root}"\n')
    for run, said in [
        (gone, f"no run {gone} on box (no {root / gone / 'manifest.json'})"),
        (unreadable, f"cannot read {root / unreadable / 'manifest.json'} on box: "),
        (no_metrics, f"cannot read {root / no_metrics / 'metrics.jsonl'} on box: "),
    ]:
        code, out, err = plot(capsys, run, "--config", str(config))
        assert (code, out) == (1, "") and len(err.splitlines()) == 1, err
        assert err.startswith(f"trackside plot: {said}") and "cat:" not in err, err
