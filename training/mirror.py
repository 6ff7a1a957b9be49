"""A stopping trainer's checkpoint files laid out in page-locked RAM ahead of time, so
SIGTERM frees the GPU in a fraction of a second.

Getting the state off the device on the stop path the ordinary way (a `.cpu()` per tensor
into fresh pageable memory, then serialising it) took seconds per GiB; the device's copy
engines fill memory that is already mapped, populated and page-locked at tens of GB/s
(bench/stage_copy.py; docs/benchmarks.md, "The operator's loop"). So, once the first
optimizer step has made the moments, a thread builds each tensor file of the checkpoint
(training/checkpoint.py) as a complete safetensors image in an anonymous RAM file
(memfd): the header written once (names, dtypes and shapes do not change while a run
trains), the data region mapped with MAP_POPULATE and registered with CUDA
(cudaHostRegister), a slot per tensor. At the stop `fill` copies every live tensor into its
slot, waits for the copies, and hands over the files' descriptors: the writer process
(training/durable.py) inherits them and copies them to disk after this process has exited,
and a trainer resuming meanwhile reads them from there (training/ram_stage.py).

The images are anonymous: a trainer killed with SIGKILL leaves nothing behind in RAM.
Where RAM is short the mirror is not built and the stop takes the ordinary path.
"""
from __future__ import annotations

import json
import mmap
import os
import struct
import threading
import time

import torch
from torch import Tensor

from training.ram_stage import MEMFD_PREFIX

SPARE = 1.25  # built only with this much more available RAM than its images take
# safetensors' names for the dtypes a checkpoint holds
DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.bfloat16: "BF16",
          torch.float16: "F16", torch.int64: "I64", torch.int32: "I32", torch.int16: "I16",
          torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL"}


def _layout(tensors: dict[str, Tensor]) -> tuple[bytes, dict[str, tuple[int, torch.dtype, tuple]], int]:
    """A safetensors header for `tensors`, each one's (offset in the file, dtype, shape),
    and the file's size. Widest dtypes first: every slot then starts aligned for its dtype, which a
    typed view of the mapping needs, with no gap between slots, which the format
    forbids."""
    order = sorted(tensors, key=lambda k: (-tensors[k].element_size(), k))
    header: dict = {"__metadata__": {"format": "pt"}}
    at = 0
    for key in order:
        t = tensors[key]
        n = t.numel() * t.element_size()
        header[key] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [at, at + n]}
        at += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data region starts 8-aligned
    head = struct.pack("<Q", len(text)) + text
    slots = {key: (len(head) + header[key]["data_offsets"][0], tensors[key].dtype,
                   tuple(tensors[key].shape)) for key in order}
    return head, slots, len(head) + at


def _available_ram() -> int:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


class _Image:
    """One tensor file's image: a memfd holding its header and a mapped data region."""

    def __init__(self, name: str, head: bytes, slots: dict, size: int, pin: bool):
        self.slots, self.pinned, self.map, self.bytes = slots, False, None, None
        self.fd = os.memfd_create(MEMFD_PREFIX + name)
        try:
            os.ftruncate(self.fd, size)
            self.map = mmap.mmap(self.fd, size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
            self.map[:len(head)] = head
            self.bytes = torch.frombuffer(self.map, dtype=torch.uint8)
            if pin:
                err = torch.cuda.cudart().cudaHostRegister(self.bytes.data_ptr(), size, 0)
                if int(err) != 0:
                    raise OSError(f"cudaHostRegister of {size} bytes failed ({err})")
                self.pinned = True
        except BaseException:
            self.release()
            os.close(self.fd)
            raise

    def slot(self, key: str) -> Tensor:
        at, dtype, shape = self.slots[key]
        n = torch.Size(shape).numel() * dtype.itemsize
        return self.bytes[at:at + n].view(dtype).view(shape)

    def unpin(self) -> None:
        if self.pinned:
            torch.cuda.cudart().cudaHostUnregister(self.bytes.data_ptr())
            self.pinned = False

    def release(self) -> None:
        """Unpinned and unmapped; the descriptor stays open for whoever still needs it."""
        self.unpin()
        self.bytes = None
        if self.map is not None:
            self.map.close()


class Mirror:
    """Built in the background from the live tensor files (training/checkpoint.py's
    `tensor_files` of the state as it is after a step); `fill` at the stop."""

    def __init__(self, files: dict[str, dict[str, Tensor]], device: torch.device, on_done):
        self.layouts = {name: _layout(tensors) for name, tensors in files.items()}
        self.nbytes = sum(size for _, _, size in self.layouts.values())
        self.images: dict[str, _Image] = {}
        self.ready = threading.Event()
        self.failed: str | None = None
        self.build_s: float | None = None
        self._on_done = on_done
        self._pin = device.type == "cuda"
        self._build = threading.Thread(target=self._make, name="stop-mirror", daemon=True)

    @classmethod
    def start(cls, files: dict[str, dict[str, Tensor]], device: torch.device,
              on_done=lambda mirror: None) -> "Mirror":
        """A mirror of `files`, building; `failed` says why there is none (RAM short).
        `on_done(mirror)` is called from the building thread when it ends."""
        mirror = cls(files, device, on_done)
        available = _available_ram()
        if available < mirror.nbytes * SPARE:
            mirror.failed = (f"{mirror.nbytes / 2**30:.1f} GiB of RAM needed, "
                             f"{available / 2**30:.1f} GiB available")
        else:
            mirror._build.start()
        return mirror

    def _make(self) -> None:
        began = time.perf_counter()
        try:
            for name, (head, slots, size) in self.layouts.items():
                self.images[name] = _Image(name, head, slots, size, self._pin)
        except (OSError, RuntimeError) as error:
            self.failed = str(error)
            for image in self.images.values():
                image.release()
                os.close(image.fd)
            self.images = {}
        else:
            self.build_s = time.perf_counter() - began
            self.ready.set()
        self._on_done(self)

    def unpin(self) -> None:
        """Its memory page-locked no more (the images stay as they are): done by a stopping
        trainer before it exits, explicitly, as unpinning 12 GiB took 0.19 s that way and
        0.7 s more when the exit did it, with the GPU still held (bench/release_exit.py)."""
        for image in self.images.values():
            image.unpin()

    def fill(self, files: dict[str, dict[str, Tensor]]) -> dict[str, int] | None:
        """Every tensor of `files` copied into its slot, the copies waited for; each
        image's file descriptor by file name, or None (not built yet, or the tensors no
        longer fit the layout) and the caller takes the ordinary path."""
        if not self.ready.is_set():
            return None
        if set(files) != set(self.images):
            self.failed = "the checkpoint's files changed since they were laid out"
            return None
        for name, tensors in files.items():
            slots = self.images[name].slots
            if set(tensors) != set(slots) or any(
                    (t.dtype, tuple(t.shape)) != slots[k][1:] for k, t in tensors.items()):
                self.failed = f"{name}'s tensors changed since it was laid out"
                return None
        for name, tensors in files.items():
            image = self.images[name]
            for key, t in tensors.items():
                image.slot(key).copy_(t.detach(), non_blocking=image.pinned)
        if self._pin:
            torch.cuda.synchronize()
        return {name: image.fd for name, image in self.images.items()}
