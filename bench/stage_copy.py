"""Ways to get a stopping trainer's state off the GPU into memory another process can
publish (/dev/shm), timed on one card: what the release-first stop path could do instead
of its per-tensor `.cpu()` and `torch.save`.

    python3 bench/stage_copy.py --gib 5      # about EAGLE-3 llama3-8b's state
    python3 bench/stage_copy.py --gib 12     # about DFlash qwen3-8b's

Each way copies the same tensors (bf16 weights and fp32 moments, sized like a drafter's)
and is timed from the first copy to the data being in /dev/shm:
- `cpu+save`: today's path: `.cpu()` per tensor into fresh pageable memory, `torch.save`
  (no CRC32s) into /dev/shm;
- `mmap`: one /dev/shm file mapped (MAP_POPULATE) at the stop, each tensor copied from the
  device straight into it;
- `mmap-early`: the same file mapped and populated beforehand (at start-up, off the stop's
  clock), then only the copies;
- `mmap-early-pinned`: that mapping also page-locked beforehand (cudaHostRegister), so the
  copies run at the DMA's full rate.
Prints one JSON document.
"""
from __future__ import annotations

import argparse
import json
import mmap
import os
import time

import torch

SHM = "/dev/shm/trackside-stage-copy"


def state(gib: float, device: torch.device) -> list[torch.Tensor]:
    """Tensors of a drafter's state: a third bf16 weights, the rest fp32 moments, in
    tensors of 64-512 MiB."""
    tensors, left = [], int(gib * 2**30)
    sizes = [512, 256, 128, 64]
    i = 0
    while left > 0:
        size = min(left, sizes[i % len(sizes)] * 2**20)
        dtype = torch.bfloat16 if i % 3 == 0 else torch.float32
        tensors.append(torch.randn(size // dtype.itemsize, dtype=dtype, device=device))
        left -= size
        i += 1
    return tensors


def mapped(nbytes: int) -> tuple[mmap.mmap, torch.Tensor]:
    fd = os.open(SHM, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.ftruncate(fd, nbytes)
        view = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
    finally:
        os.close(fd)
    return view, torch.frombuffer(view, dtype=torch.uint8)


def copy_into(buffer: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    offset = 0
    for t in tensors:
        n = t.numel() * t.element_size()
        buffer[offset:offset + n].view(t.dtype).copy_(t, non_blocking=True)
        offset += n
    torch.cuda.synchronize()


def timed(label: str, tensors: list[torch.Tensor], nbytes: int) -> dict:
    torch.cuda.synchronize()
    if os.path.exists(SHM):
        os.remove(SHM)
    result: dict = {"way": label}
    if label == "cpu+save":
        started = time.perf_counter()
        on_cpu = [t.cpu() for t in tensors]
        result["off_device_s"] = time.perf_counter() - started
        torch.serialization.set_crc32_options(False)
        torch.save(on_cpu, SHM)
        torch.serialization.set_crc32_options(True)
        result["total_s"] = time.perf_counter() - started
        return result
    early = label.startswith("mmap-early")
    started = time.perf_counter()
    view, buffer = mapped(nbytes)
    result["map_s"] = time.perf_counter() - started
    if label == "mmap-early-pinned":
        pinned = time.perf_counter()
        torch.cuda.cudart().cudaHostRegister(buffer.data_ptr(), nbytes, 0)
        result["pin_s"] = time.perf_counter() - pinned
    copied = time.perf_counter()
    copy_into(buffer, tensors)
    result["copy_s"] = time.perf_counter() - copied
    result["total_s"] = time.perf_counter() - (copied if early else started)
    result["gb_per_s"] = nbytes / 1e9 / result["copy_s"]
    if label == "mmap-early-pinned":
        torch.cuda.cudart().cudaHostUnregister(buffer.data_ptr())
    del buffer
    view.close()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=5.0)
    args = parser.parse_args()
    tensors = state(args.gib, torch.device("cuda"))
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    results = [timed(way, tensors, nbytes) for way in ("cpu+save", "mmap", "mmap-early", "mmap-early-pinned")]
    if os.path.exists(SHM):
        os.remove(SHM)
    print(json.dumps({"gib": nbytes / 2**30, "tensors": len(tensors), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
