"""The pid-reuse attack, run as init of a pid namespace of its own (`unshare -pf
--mount-proc`, test_kill_bystander.py): a kill plan is made of a tmux session, a process of
the plan ends, and ns_last_pid gives its pid to a bystander started within the same second;
then the plan is carried out. Prints one JSON line: whether it could be arranged, and
whether the bystander was signalled.

Only this process forks in the namespace, so the pid after ns_last_pid is the next fork's.
Orphans reparent to this process (init): the ended process is reaped here, freeing its pid.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from backends import kill  # noqa: E402
from backends.hosts import LocalHost  # noqa: E402

HZ = os.sysconf("SC_CLK_TCK")
BOOT = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime "))
ATTEMPTS = 5


def stat(pid: int) -> list[str]:
    """/proc/PID/stat's fields after the process name (the state first)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def second(pid: int) -> int:
    """The wall-clock second the process started in, as `ps -o lstart` shows it."""
    return BOOT + int(stat(pid)[19]) // HZ


def orphan_of(session_leader: int) -> int | None:
    """The process of the leader's session orphaned to this init: the run's sleep (not the
    subshell that forks it, which is of the session too, for a moment)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != session_leader:
            try:
                fields = stat(int(entry.name))
            except OSError:
                continue
            if int(fields[3]) == session_leader and fields[1] == "1" and fields[0] != "Z":
                return int(entry.name)
    return None


async def attempt(host: LocalHost, n: int) -> dict | None:
    time.sleep(1 - time.time() % 1)  # the start of a second: the attempt has all of it
    session = f"reuse{n}"
    # The pane's process leads the session; its orphan (ppid this init) is of the session.
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "sh", "-c", "(sleep 600 >/dev/null 2>&1 &); exec sleep 601"], check=True)
    leader = int(subprocess.run(["tmux", "list-panes", "-t", f"={session}:", "-F", "#{pane_pid}"],
                                capture_output=True, text=True, check=True).stdout)  # fmt: skip
    deadline = time.monotonic() + 10
    while (victim := orphan_of(leader)) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    plan = await kill.plan_kill(host, session, smi="/nonexistent/nvidia-smi", nvml=False)
    started = second(victim)
    os.kill(victim, 9)
    os.waitpid(victim, 0)
    Path("/proc/sys/kernel/ns_last_pid").write_text(str(victim - 1))
    bystander = subprocess.Popen(["sleep", "600"])
    arranged = bystander.pid == victim and second(bystander.pid) == started
    if not arranged:
        bystander.kill()
        bystander.wait()
        subprocess.run(["tmux", "kill-session", "-t", f"={session}"])
        return None
    report = await kill.kill_run(host, plan, grace_s=5, smi="/nonexistent/nvidia-smi", nvml=False)
    return {
        "in_plan": victim in plan.tree, "same_second": True, "reused": True,
        "signalled": victim in {*report.signalled, *report.killed}, "bystander_alive": bystander.poll() is None,
    }  # fmt: skip


async def main(runs_root: str) -> dict:
    host = LocalHost(runs_root=runs_root)
    for n in range(ATTEMPTS):
        if (result := await attempt(host, n)) is not None:
            return result
    return {"skipped": f"no pid reused within its second in {ATTEMPTS} attempts (a loaded machine)"}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1]))), flush=True)
