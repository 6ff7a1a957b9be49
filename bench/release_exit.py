"""How long a process's GPU memory outlives its exit, with and without page-locked host
memory (a stop's RAM mirror, training/mirror.py) still registered at the exit.

A child takes `--gib` of GPU memory and, per case, maps `--host-gib` of a memfd
(populated); `pinned` also registers it with CUDA (cudaHostRegister), `unpinned-first`
unregisters it before the exit, `hugepages` asks for transparent huge pages on the memfd
first (MADV_HUGEPAGE; only where /sys/kernel/mm/transparent_hugepage/shmem_enabled allows
them). The child then says when it calls os._exit; the parent polls NVML every 5 ms until
the child's pid holds no memory on the card. Prints one JSON document.

    python3 bench/release_exit.py --gib 26 --host-gib 12
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

CHILD = r"""
import mmap, os, sys, time, torch
gib, host_gib, case = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
held = torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
if case != "none":
    size = int(host_gib * 2**30)
    fd = os.memfd_create("release-exit")
    os.ftruncate(fd, size)
    view = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | (0 if case == "hugepages" else mmap.MAP_POPULATE))
    if case == "hugepages":
        view.madvise(mmap.MADV_HUGEPAGE)
    buffer = torch.frombuffer(view, dtype=torch.uint8)
    if case == "hugepages":
        buffer.fill_(0)  # populated after the advice, so in huge pages where it is taken
    if case != "mapped":
        started = time.perf_counter()
        assert int(torch.cuda.cudart().cudaHostRegister(buffer.data_ptr(), size, 0)) == 0
        print(f"pin_s {time.perf_counter() - started:.3f}", flush=True)
    if case == "unpinned-first":
        started = time.perf_counter()
        torch.cuda.cudart().cudaHostUnregister(buffer.data_ptr())
        print(f"unpin_s {time.perf_counter() - started:.3f}", flush=True)
print(f"exit {time.time()!r}", flush=True)
os._exit(0)
"""


def gpu_pids(handle) -> set[int]:
    import pynvml

    return {p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}


def case(name: str, gib: float, host_gib: float, handle) -> dict:
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(gib), str(host_gib), name],
                             stdout=subprocess.PIPE, text=True)
    said = {}
    for line in child.stdout:
        key, value = line.split()
        said[key] = float(value)
        if key == "exit":
            break
    while child.pid in gpu_pids(handle):
        time.sleep(0.005)
    released = time.time()
    child.wait()
    return {"case": name, **{k: v for k, v in said.items() if k != "exit"},
            "exit_to_released_s": round(released - said["exit"], 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=26.0)
    parser.add_argument("--host-gib", type=float, default=12.0)
    args = parser.parse_args()
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    thp = Path("/sys/kernel/mm/transparent_hugepage/shmem_enabled")
    cases = ["none", "mapped", "pinned", "unpinned-first"] + (["hugepages"] if thp.exists() and "[never]" not in thp.read_text() and "[deny]" not in thp.read_text() else [])
    results = [case(name, args.gib, args.host_gib, handle) for name in cases for _ in range(2)]
    print(json.dumps({"gib": args.gib, "host_gib": args.host_gib,
                      "shmem_thp": thp.read_text().strip() if thp.exists() else None,
                      "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
