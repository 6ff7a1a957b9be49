"""`trackside [--config PATH] | demo`: bad flags and configs are a message and exit 2."""

from __future__ import annotations

from tui.commands.dashboard import dashboard, main


def test_missing_config_file_names_the_flag(capsys, tmp_path):
    assert main(["--config", str(tmp_path / "absent.toml")]) == 2
    assert "--config" in capsys.readouterr().err


def test_bad_config_value_names_the_key(capsys, tmp_path):
    config = tmp_path / "config.toml"
    config.write_text('[hosts.gpu1]\naddress = "10.0.0.5"\nport = "abc"\n')
    assert main(["--config", str(config)]) == 2
    assert "hosts.gpu1.port" in capsys.readouterr().err


def test_unknown_command_is_a_usage_error(capsys):
    assert main(["dance"]) == 2
    assert capsys.readouterr().err.startswith("trackside: command: invalid choice: 'dance'")


def test_config_hosts_and_poll_interval(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text('[defaults]\npoll_ms = 500\n[hosts.a]\n[hosts.b]\naddress = "10.0.0.5"\nnvidia_smi = "/opt/smi"\nrecord = false\n')
    app = dashboard(str(config))
    assert list(app.watched) == ["a", "b"]
    assert app.watched["a"].host.is_local and app.watched["b"].smi == "/opt/smi"
    assert app.monitors["b"].interval == 0.5
    assert app.monitors["a"].record and not app.monitors["b"].record  # its runs' energy: "recorder off"


def test_ctrl_c_while_the_demo_run_stops_says_what_is_left_without_a_traceback(tmp_path):
    """The user quit, the demo is stopping its run, and Ctrl-C comes (the run ignores
    SIGTERM here, so the stop waits out its grace): a line naming how to stop it, exit 130."""
    import os
    import signal
    import subprocess
    import sys
    import time

    # The run's sleep ignores what a killed session sends it: named, to be ended after.
    sleep = f"sleep 600.{os.getpid()}"
    script = (
        "import asyncio, sys\n"
        "from backends import runs\n"
        "from backends.hosts import LocalHost\n"
        "from tui.commands.dashboard import end_demo_run\n"
        f"host = LocalHost(runs_root={str(tmp_path)!r})\n"
        f"info = asyncio.run(runs.launch(host, ['bash', '-c', \"trap '' TERM; {sleep}\"]))\n"
        "sys.exit(end_demo_run(host, info, keep=False))\n"
    )
    # SIGINT as a terminal's shell gives it: a test before this one in the same worker may
    # have left SIGINT ignored, and a child inherits that (Python then installs no handler),
    # so the Ctrl-C was never seen and the stop waited out its grace.
    demo = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    said = demo.stdout.readline()
    try:
        assert "stopping the demo run" in said, said
        time.sleep(1.0)  # inside the grace: the SIGTERM is out, the run still there
        os.kill(demo.pid, signal.SIGINT)
        out, err = demo.communicate(timeout=30)
    finally:
        demo.kill()
        if "(tmux session " in said:
            session = said.split("(tmux session ", 1)[1].split(")")[0]
            subprocess.run(["tmux", "kill-session", "-t", f"={session}"], capture_output=True)
        subprocess.run(["pkill", "-KILL", "-x", "-f", sleep], capture_output=True)
    assert demo.returncode == 130, (out, err)
    assert "Traceback" not in err and "interrupted: the demo run may still be running" in err, err


def test_the_demo_stops_the_runs_relaunched_from_its_run(local_host, capsys):
    """`trackside demo`, e → R → q: the demo's run had ended and its relaunch went on
    training (it said "it had already ended", exit 0). Its lineage is stopped, each said."""
    import asyncio

    from backends import kill, runs
    from backends.relaunch import Relaunch, relaunch
    from tui.commands.dashboard import end_demo_run

    host = local_host

    async def demo_then_R():
        demo = await runs.launch(host, ["sleep", "600"])
        await kill.kill_run(host, demo.run_id, grace_s=5, nvml=False)
        child, _ = await relaunch(Relaunch(host.name, demo.run_id), {host.name: host})
        grandchild, _ = await relaunch(Relaunch(host.name, child.run_id), {host.name: host})
        return demo, child, grandchild

    demo, child, grandchild = asyncio.run(demo_then_R())
    assert end_demo_run(host, demo, keep=True) == 0
    kept = capsys.readouterr().out
    assert f"its relaunch {child.run_id} (from {demo.run_id}) goes on in tmux session {child.session}" in kept
    assert f"stop it with: trackside kill {grandchild.run_id}" in kept and "the demo run" not in kept  # it ended
    assert end_demo_run(host, demo, keep=False) == 0
    said = capsys.readouterr().out
    assert f"stopping the demo run {demo.run_id}" in said and "it had already ended" in said
    assert f"stopping its relaunch {child.run_id} (from {demo.run_id})" in said
    assert f"stopping its relaunch {grandchild.run_id} (from {child.run_id})" in said
    assert said.count("stopped in ") == 2
    listed = {info.run_id: info.state for info in asyncio.run(runs.list_runs(host))}
    assert runs.RunPhase.RUNNING not in listed.values(), listed
