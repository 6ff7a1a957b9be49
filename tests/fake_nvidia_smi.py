#!/usr/bin/env python3
"""A FAKE nvidia-smi for machines without a GPU: a test double, never shipped.

It answers the queries trackside makes by replaying what a real H200 printed
(tests/fixtures/h200/): `--query-gpu=FIELDS` and `--query-compute-apps=FIELDS` with
`--format=csv[,noheader][,nounits]`, the `-lms N` / `--loop-ms=N` loop, and plain `nvidia-smi`.
Install it as `nvidia-smi` (a symlink in a directory put first on PATH), or pass its path as
the `smi` argument. Stdlib only, so any python3 runs it.

Environment switches:
  FAKE_NVIDIA_SMI_STATE=idle|load   which capture to replay (default idle)
  FAKE_NVIDIA_SMI_GPUS=N            pretend to have N identical GPUs (default 1)
  FAKE_NVIDIA_SMI_FAIL=no-devices|driver|garbage
                                    fail as a real one does: "No devices were found" (exit 6),
                                    the driver-communication error (exit 9), or lines that are
                                    not CSV (exit 0)
  FAKE_NVIDIA_SMI_NA=FIELD[=TEXT],… print TEXT (default [N/A]) for these fields
  FAKE_NVIDIA_SMI_PROCS=FILE.json   compute processes: a list of {"pid", "gpu", "used_mib",
                                    "name"}, read on every call. Only live PIDs are listed and
                                    a GPU's memory.used is the idle figure plus theirs, so a
                                    killed process releases its memory as on a real card.
  FAKE_NVIDIA_SMI_LOOPS=K           in loop mode, exit after K samples (default: run until killed)
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "h200"
# The --query-gpu field list of the query-gpu-*.csv captures (see the fixtures' README).
CAPTURED_FIELDS = (
    "index,name,uuid,power.draw,power.limit,power.max_limit,memory.used,memory.total,"
    "utilization.gpu,utilization.memory,temperature.gpu,clocks.sm,pstate"
).split(",")
APP_HEADERS = {
    "pid": "pid",
    "process_name": "process_name",
    "used_memory": "used_gpu_memory [MiB]",
    "gpu_uuid": "gpu_uuid",
}
NO_DEVICES = "No devices were found"
DRIVER_ERROR = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running."
)


def cells(line: str) -> list[str]:
    return line.rstrip("\n").split(", ")


def captured_gpu(state: str) -> dict[str, tuple[str, str, str]]:
    """field → (header cell, value with units, value without units) from the capture."""
    header, with_units = (FIXTURES / f"query-gpu-{state}.csv").read_text().splitlines()
    nounits = (FIXTURES / f"query-gpu-{state}-nounits.csv").read_text().splitlines()[0]
    return {
        f: (h, u, n)
        for f, h, u, n in zip(CAPTURED_FIELDS, cells(header), cells(with_units), cells(nounits))
    }


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie has already given its GPU memory back
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def processes() -> list[dict] | None:
    """The declared live processes, or None when the capture's own rows are replayed."""
    path = os.environ.get("FAKE_NVIDIA_SMI_PROCS")
    if not path:
        return None
    return [p for p in json.loads(Path(path).read_text()) if alive(int(p["pid"]))]


def na_fields() -> dict[str, str]:
    spec = os.environ.get("FAKE_NVIDIA_SMI_NA", "")
    out = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, _, text = item.partition("=")
        out[name] = text or "[N/A]"
    return out


def gpu_uuid(index: int, captured: str) -> str:
    return captured if index == 0 else f"{captured[:-12]}{444444444444 + index:012d}"


def gpu_rows(fields: list[str], units: bool, sample: int) -> list[str]:
    state = os.environ.get("FAKE_NVIDIA_SMI_STATE", "idle")
    captured = captured_gpu(state)
    overrides = na_fields()
    procs = processes()
    stream_power = [cells(ln)[1] for ln in (FIXTURES / "stream-lms250.csv").read_text().splitlines()]
    rows = []
    for index in range(int(os.environ.get("FAKE_NVIDIA_SMI_GPUS", "1"))):
        values = {f: (u if units else n) for f, (_, u, n) in captured.items()}
        values["index"] = str(index)
        values["uuid"] = gpu_uuid(index, values["uuid"])
        if procs is not None:
            used = int(captured_gpu("idle")["memory.used"][2])
            used += sum(int(p.get("used_mib", 0)) for p in procs if int(p.get("gpu", 0)) == index)
            values["memory.used"] = f"{used} MiB" if units else str(used)
        if state == "load" and sample >= 0:  # the loop replays the power a real -lms 250 saw
            power = stream_power[sample % len(stream_power)]
            values["power.draw"] = f"{power} W" if units else power
        values.update(overrides)
        rows.append(", ".join(values[f] for f in fields))
    return rows


def app_rows(fields: list[str], units: bool) -> list[str]:
    state = os.environ.get("FAKE_NVIDIA_SMI_STATE", "idle")
    uuid = captured_gpu("idle")["uuid"][2]
    overrides = na_fields()
    procs = processes()
    if procs is None:
        lines = (FIXTURES / f"compute-apps-{state}.csv").read_text().splitlines()[1:]
        procs = [
            {"pid": c[0], "name": c[1], "used_mib": c[2].removesuffix(" MiB"), "gpu": 0}
            for c in map(cells, lines)
        ]
    rows = []
    for p in procs:
        values = {
            "pid": str(p["pid"]),
            "process_name": p.get("name", "python3"),
            "used_memory": f"{p.get('used_mib', 0)} MiB" if units else str(p.get("used_mib", 0)),
            "gpu_uuid": gpu_uuid(int(p.get("gpu", 0)), uuid),
        }
        values.update(overrides)
        rows.append(", ".join(values[f] for f in fields))
    return rows


def emit(rows: list[str]) -> None:
    sys.stdout.write("".join(f"{row}\n" for row in rows))
    sys.stdout.flush()


def fail(message: str, code: int) -> None:
    print(message, flush=True)
    sys.exit(code)


def main(argv: list[str]) -> None:
    options: dict[str, str] = {}
    args = iter(argv)
    for arg in args:
        if arg in ("-lms", "--loop-ms"):
            options["loop-ms"] = next(args, "")
        elif arg.startswith("--") and "=" in arg:
            key, _, value = arg[2:].partition("=")
            options[key] = value
        else:
            fail(f'Invalid combination of input arguments "{arg}". Please run \'nvidia-smi -h\' for help.', 2)

    mode = os.environ.get("FAKE_NVIDIA_SMI_FAIL", "")
    if mode == "no-devices":
        fail(NO_DEVICES, 6)
    if mode == "driver":
        fail(DRIVER_ERROR, 9)

    if not options:
        state = os.environ.get("FAKE_NVIDIA_SMI_STATE", "idle")
        sys.stdout.write((FIXTURES / f"nvidia-smi-{state}.txt").read_text())
        return

    fmt = options.get("format", "").split(",")
    if fmt[0] != "csv":
        fail(f'"{options.get("format", "")}" is not a valid format.', 2)
    header, units = "noheader" not in fmt, "nounits" not in fmt
    if "query-gpu" in options:
        fields = options["query-gpu"].split(",")
        known = captured_gpu("idle")
        if bad := [f for f in fields if f not in known]:
            fail(f'Field "{bad[0]}" is not a valid field to query.', 2)
        head = ", ".join(known[f][0] for f in fields)

        def sample(n: int) -> list[str]:
            return gpu_rows(fields, units, n)
    elif "query-compute-apps" in options:
        fields = options["query-compute-apps"].split(",")
        if bad := [f for f in fields if f not in APP_HEADERS]:
            fail(f'Field "{bad[0]}" is not a valid field to query.', 2)
        head = ", ".join(APP_HEADERS[f] for f in fields)

        def sample(n: int) -> list[str]:
            return app_rows(fields, units)
    else:
        fail("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.", 2)

    if header:
        emit([head])
    if "loop-ms" not in options:
        emit(["garbage: not a CSV row"] if mode == "garbage" else sample(-1))
        return
    interval = int(options["loop-ms"]) / 1000
    loops = int(os.environ.get("FAKE_NVIDIA_SMI_LOOPS", "0")) or None
    n = 0
    while loops is None or n < loops:
        rows = [f"garbage {n}: \x1b[31m??\x1b[0m"] if mode == "garbage" else sample(n)
        emit(rows)
        n += 1
        time.sleep(interval)


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except (BrokenPipeError, KeyboardInterrupt):
        pass
