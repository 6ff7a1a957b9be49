"""The recorder as it runs on a host: stdlib only, its source given inline to `python3 -c`
after layout.py's and files.py's (backends/recorder/start.py), so nothing under the runs
root is ever run. Its sampling: nvidia-smi's own loop for the GPUs, and every TICK_S the
GPU processes, the tmux panes and the logs' sizes, each written as layout.py says.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time

if __package__:  # run inline (start.py), layout.py's and files.py's names are there already
    from backends.recorder.files import Day, _ours, rotate
    from backends.recorder.layout import GPU_DIR, KINDS, MAX_LINE, day_of, escape, number

MAX_LOGS = 20000  # log files indexed at most, per tick
GPU_QUERY = ("index", "uuid", "power.draw", "power.limit", "memory.used", "memory.total", "utilization.gpu")
APPS_QUERY = ("gpu_uuid", "pid", "used_memory")


def _stat(pid: int) -> tuple[int, int] | None:
    """(ppid, start ticks) of a process, from /proc."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()
        return int(fields[1]), int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def _uptime_ticks() -> int | None:
    """Now, in the clock ticks since boot that /proc/PID/stat's start time counts."""
    try:
        with open("/proc/uptime", "rb") as f:
            return int(float(f.read().split()[0]) * os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def _ancestors(pid: int) -> list[int]:
    chain, at = [], pid
    for _ in range(128):
        stat = _stat(at)
        if stat is None or stat[0] <= 0 or stat[0] in chain:
            break
        chain.append(stat[0])
        at = stat[0]
    return chain


def _run(argv: list[str], env: dict) -> str:
    try:
        return subprocess.run(argv, capture_output=True, timeout=15, env=env).stdout[: 1 << 20].decode(errors="replace")
    except (OSError, subprocess.SubprocessError):
        return ""


def procs_rows(smi: str, env: dict) -> list[str]:
    """The GPU processes nvidia-smi lists, each with what /proc says of its pid: its start
    and parents, unless that pid is a process started after the listing began (the listed
    one ended and its pid was reused), or gone: then its row says no more than the listing."""
    listed = _uptime_ticks()
    out = _run([smi, f"--query-compute-apps={','.join(APPS_QUERY)}", "--format=csv,noheader,nounits"], env)
    rows = []
    for line in out.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != 3 or not cells[1].isdigit() or "," in cells[0]:
            continue
        pid = int(cells[1])
        stat = _stat(pid)
        if stat is None or listed is None or stat[1] > listed:
            rows.append(f"{escape(cells[0])},{pid},,{number(cells[2])},")
            continue
        rows.append(f"{escape(cells[0])},{pid},{stat[1]},{number(cells[2])},{' '.join(map(str, _ancestors(pid)))}")
    return sorted(rows)


def panes_rows(sockets: list[str], env: dict) -> list[str]:
    rows = []
    for socket in sockets:
        out = _run(["tmux", "-L", socket or "default", "-u", "list-panes", "-a", "-F", "#{pane_pid} #{session_id}",
                    ";", "list-sessions", "-F", "#{session_id} #{session_name}"], env)  # fmt: skip
        found = out.split("\n")[:-1]
        count = next((i for i, line in enumerate(found) if not re.fullmatch(r"\d+ \$\d+", line)), len(found))
        panes = [line.split(" ") for line in found[:count]]
        names = dict(line.partition(" ")[::2] for line in found[count:])
        # A name printed over two lines (an older tmux keeps a newline) would break the
        # count of one line a session: then this socket's panes are not said this time.
        if len(names) != len(found) - count or set(names) != {sid for _, sid in panes}:
            continue
        rows += [f"{escape(socket)},{pid},{escape(names[sid])}" for pid, sid in panes]
    return sorted(rows)


def logs_rows(root: str) -> list[str]:
    """The size of each pane recording and run dir console log, never through a link."""
    found: list[tuple[str, int]] = []

    def add(rel: str) -> None:
        try:
            st = os.lstat(os.path.join(root, rel))
        except OSError:
            return
        if (st.st_mode & 0o170000) == 0o100000 and len(found) < MAX_LOGS:
            found.append((rel, st.st_size))

    def dirs(rel: str) -> list[str]:
        try:
            with os.scandir(os.path.join(root, rel)) as it:
                return sorted(e.name for e in it if e.is_dir(follow_symlinks=False))[:MAX_LOGS]
        except OSError:
            return []

    for name in dirs(""):
        if name == "panes":
            for socket in dirs("panes"):
                for session in dirs(f"panes/{socket}"):
                    try:
                        with os.scandir(os.path.join(root, "panes", socket, session)) as it:
                            logs = sorted(e.name for e in it if e.name.endswith(".log"))[:64]
                    except OSError:
                        logs = []
                    for log in logs:
                        add(f"panes/{socket}/{session}/{log}")
        elif name != "gpu":
            add(f"{name}/console.log")
    return [f"{size},{escape(rel)}" for rel, size in found]



def still_there(root: str, dirfd: int) -> bool:
    """Whether `root`/gpu is still the directory the recorder writes into (`dirfd`): not
    removed, with its runs root or alone, nor replaced."""
    try:
        there, held = os.stat(os.path.join(root, GPU_DIR), follow_symlinks=False), os.fstat(dirfd)
    except OSError:
        return False
    return held.st_nlink > 0 and (there.st_dev, there.st_ino) == (held.st_dev, held.st_ino)


def gpu_loop(days: Day, smi: str, loop_ms: int, env: dict, retry_s: float) -> None:
    argv = [smi, f"--query-gpu={','.join(GPU_QUERY)}", "--format=csv,noheader,nounits", "-lms", str(loop_ms)]
    declared: dict[str, str] = {}
    while True:
        try:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        except OSError:
            time.sleep(retry_s)
            continue
        assert proc.stdout is not None
        try:
            samples(proc.stdout, days, declared)
        except Exception as error:  # noqa: BLE001 - the loop goes on whatever one line did
            print(f"recorder: {error!r}", file=sys.stderr, flush=True)
        proc.kill()
        proc.wait()
        time.sleep(retry_s)


def samples(stdout, days: Day, declared: dict[str, str]) -> None:
    """nvidia-smi's rows as they come, each stamped with its arrival, into the day's file."""
    while line := stdout.readline(MAX_LINE):
        cells = [c.strip() for c in line.decode(errors="replace").split(",")]
        if len(cells) != len(GPU_QUERY) or not cells[0].isdigit():
            continue
        index, uuid = cells[0], escape(cells[1])
        changed, declared[index] = declared.get(index) != uuid, uuid
        rows = [f"{index},{uuid}"] if changed else []
        # A new day's file declares every GPU again, at its start.
        header = lambda: [f"{i},{u}" for i, u in declared.items() if not (changed and i == index)]  # noqa: E731
        days.write(time.time(), [*rows, ",".join([index, *map(number, cells[2:])])], header)


def main(argv: list[str]) -> None:
    root, socket, smi = argv[0], argv[1], argv[2]
    tick_s, loop_ms, keep_days, cap = float(argv[3]), int(argv[4]), int(argv[5]), int(argv[6])
    env = {k: v for k, v in os.environ.items() if k not in ("TMUX", "TMUX_PANE")}
    dirfd = os.open(os.path.join(root, GPU_DIR), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    if not _ours(dirfd, directory=True):
        sys.exit(f"recorder: {root}/gpu is not this user's alone")
    os.umask(0o077)
    days = {kind: Day(dirfd, kind) for kind in KINDS}
    now = time.time()
    rotate(dirfd, day_of(now), keep_days, cap)
    days["ticks"].write(now, [f"start,{tick_s:g}"])
    threading.Thread(target=gpu_loop, args=(days["gpu"], smi, loop_ms, env, tick_s), daemon=True).start()
    sockets = list(dict.fromkeys([socket, ""]))
    last: dict[str, list[str]] = {}
    while True:
        if not still_there(root, dirfd):  # removed or replaced (a benchmark's temporary root): never write into nothing
            sys.exit(f"recorder: {root}/{GPU_DIR} is gone: ended")
        now = time.time()
        snapshot = {"procs": procs_rows(smi, env), "panes": panes_rows(sockets, env), "logs": logs_rows(root)}
        t = time.time()
        for kind, rows in snapshot.items():
            new_day = days[kind].day != day_of(t)
            if kind == "logs":  # the sizes that changed; all of them at a file's start
                changed = rows if new_day else sorted(set(rows) - set(last.get(kind, ())))
                if changed:
                    days[kind].write(t, changed)
            elif new_day or rows != last.get(kind):
                days[kind].write(t, rows or [""])  # a row of TIME alone: none
            last[kind] = rows
        if days["ticks"].write(t, [""]):
            rotate(dirfd, day_of(t), keep_days, cap)
        time.sleep(max(0.0, tick_s - (time.time() - now)))


if __name__ == "__main__":
    main(sys.argv[1:])
