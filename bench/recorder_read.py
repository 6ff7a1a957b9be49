"""What reading a host's GPU recording costs the dashboard (backends/recorder/read.py's
read_recording): a week of 8 GPUs sampled each second, written in the recorder's format
into a temporary runs root and read over the Host API (this machine's shell), as the
fleet's energy worker, `trackside watch --since` and replay read it.

    python3 bench/recorder_read.py [--days 7] [--gpus 8] [--parts last_3h,last_day,week,poll]

For each part: its wall and CPU seconds, the longest the event loop left a 10 ms ticker
waiting meanwhile (what the dashboard froze), the bytes the host sent, the samples read.
`last_3h` and `last_day` read from that far back to the recording's end; `week` reads it
all (a reader with a cap reads on until done: `calls` and `catch_up_s`); `poll` reads
again 5 s after a reading ended (with a Cursor where the reader has one). Runs against
whichever checkout it sits in. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from backends.hosts import LocalHost  # noqa: E402
from backends.recorder import read  # noqa: E402

T0 = 1793836800.0  # 2026-11-05 00:00:00 UTC, in the past
ROWS = ",{},312.50,700.00,80000,143771,97\n"


def day_of(t: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(t))


def samples(a: float, b: float, gpus: int, declare: bool) -> bytes:
    out = [f"{a:.2f},{i},GPU-{i:08d}-1111-2222-3333-444444444444\n" for i in range(gpus)] if declare else []
    rows = [ROWS.format(i) for i in range(gpus)]
    t = a
    while t < b:
        stamp = f"{t:.2f}"
        out.append("".join(stamp + row for row in rows))
        t += 1.0
    return "".join(out).encode()


def write(directory: Path, name: str, data: bytes, mode: str = "wb") -> None:
    with open(directory / name, mode) as f:
        f.write(data)
    (directory / name).chmod(0o600)


class Counting(LocalHost):
    fetched = 0

    async def chunks(self, argv):
        async for chunk in super().chunks(argv):
            self.fetched += len(chunk)
            yield chunk


async def measured(host: Counting, work) -> dict:
    longest, done = 0.0, asyncio.Event()

    async def ticker() -> None:
        nonlocal longest
        last = time.monotonic()
        while not done.is_set():
            await asyncio.sleep(0.01)
            now = time.monotonic()
            longest, last = max(longest, now - last - 0.01), now

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    host.fetched, wall, cpu = 0, time.monotonic(), time.process_time()
    rec = await work
    wall, cpu = time.monotonic() - wall, time.process_time() - cpu
    done.set()
    await task  # its last tick: a reading that held the loop to its end counts too
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "loop_max_gap_s": round(longest, 3),
            "bytes": host.fetched, "samples": len(rec.gpus)}, rec  # fmt: skip


async def main(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="recorder-read-") as temp:
        return await parts(Path(temp), args)


async def parts(root: Path, args: argparse.Namespace) -> dict:
    gpu = root / "gpu"
    gpu.mkdir(mode=0o700)
    root.chmod(0o700)
    for d in range(args.days):
        t = T0 + d * 86400
        write(gpu, f"{day_of(t)}.gpu", samples(t, t + 86400, args.gpus, True))
        write(gpu, f"{day_of(t)}.ticks", (f"{t:.2f},start,5\n" + "".join(f"{t + s:.2f}\n" for s in range(0, 86400, 5))).encode())
        write(gpu, f"{day_of(t)}.procs", f"{t:.2f},GPU-00000000-1111-2222-3333-444444444444,4000,987,25578,3000 1\n".encode())
        write(gpu, f"{day_of(t)}.panes", f"{t:.2f},ts,3000,train\n".encode())
    end = T0 + args.days * 86400 - 1
    host = Counting(runs_root=str(root))
    cursors = "cursor" in inspect.signature(read.read_recording).parameters
    result: dict = {"days": args.days, "gpus": args.gpus, "bytes_on_disk": sum(p.stat().st_size for p in gpu.iterdir()), "cursor": cursors}
    idle, _ = await measured(host, asyncio.sleep(2.0, read.parse_recording({}, T0, T0)))
    result["idle_loop_max_gap_s"] = idle["loop_max_gap_s"]  # the machine's own share of a gap
    for part in args.parts.split(","):
        if part in ("last_3h", "last_day"):
            since = end - (3 * 3600 if part == "last_3h" else 86400)
            result[part], _ = await measured(host, read.read_recording(host, since, end))
        elif part == "week":
            result[part], rec = await measured(host, read.read_recording(host, T0, end))
            if getattr(rec, "read_to", None) is not None:  # read on until all is read
                cursor, calls, began = read.Cursor(), 0, time.monotonic()
                since = T0
                while True:
                    rec = await read.read_recording(host, since, end, cursor=cursor)
                    calls += 1
                    if rec.read_to is None:
                        break
                    since = rec.read_to - 5
                result[part].update(calls=calls, catch_up_s=round(time.monotonic() - began, 1))
        elif part == "poll":
            last = end - 60
            kwargs = {"cursor": read.Cursor()} if cursors else {}
            await read.read_recording(host, last - 5, end, **kwargs)
            write(gpu, f"{day_of(end)}.gpu", samples(end + 1, end + 6, args.gpus, False), "ab")
            result[part], _ = await measured(host, read.read_recording(host, end - 5, end + 6, **kwargs))
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--parts", default="last_3h,last_day,week,poll")
    print(json.dumps(asyncio.run(main(parser.parse_args()))))
