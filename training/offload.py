"""What backward keeps, kept in pinned host memory instead (`train --offload-saved`).

At kimi-k2 131,072 x TTT 5 with every step recomputed, what backward keeps between the
forward and its use is over 40 GiB of the 113 GiB `fit` predicts: the loss's gradients,
each recomputed step's inputs (its hidden state and every earlier step's keys and
values). These saved-tensor hooks copy each such tensor to pinned host memory on a side
stream as it is saved, so the copy overlaps the forward's compute and the device's copy
is freed when the forward lets it go; backward copies it back when its node runs.

A tensor several nodes save (a step's keys, read by every later recomputed step) is
copied once: the copy is found again by the tensor itself while the tensor lives and has
not been changed since (its version).
"""
from __future__ import annotations

import weakref

import torch
from torch import Tensor

# Under this many bytes a tensor stays where it is: a copy costs more than it saves.
MIN_BYTES = 1 << 20


class _Host:
    """One tensor's host copy, and the event after which the copy is whole. Both ways the
    copy has the tensor's own strides: compiled backward graphs assert the strides of
    what they saved (a head-split view of token-major rows is not contiguous)."""

    def __init__(self, tensor: Tensor, side: torch.cuda.Stream | None):
        self.device = tensor.device
        self.copy = torch.empty_strided(tensor.size(), tensor.stride(), dtype=tensor.dtype,
                                        pin_memory=side is not None)
        self.done = None
        if side is None:  # a CPU tensor: the copy is a copy all the same
            self.copy.copy_(tensor)
            return
        side.wait_stream(torch.cuda.current_stream(tensor.device))
        with torch.cuda.stream(side):
            self.copy.copy_(tensor, non_blocking=True)
            self.done = torch.cuda.Event()
            self.done.record(side)
        tensor.record_stream(side)  # its memory is not reused before the copy has read it

    def back(self) -> Tensor:
        if self.done is None:
            return self.copy
        torch.cuda.current_stream(self.device).wait_event(self.done)
        back = torch.empty_strided(self.copy.size(), self.copy.stride(),
                                   dtype=self.copy.dtype, device=self.device)
        return back.copy_(self.copy, non_blocking=True)


class HostOffload(torch.autograd.graph.saved_tensors_hooks):
    """Saved tensors of MIN_BYTES or more, in host memory from save to use."""

    def __init__(self, min_bytes: int = MIN_BYTES, resident: tuple[Tensor, ...] = ()):
        """`resident`: tensors the device holds through the step anyway (the batch's):
        a copy of what they hold (of their storage) would free nothing."""
        self.copies = 0  # host copies made (a tensor saved twice is copied once)
        self.saved = 0  # tensors that went through the host
        self._side: dict[torch.device, torch.cuda.Stream] = {}
        self._known: dict[int, tuple[weakref.ref, int, _Host]] = {}
        self._min_bytes = min_bytes
        self._resident = {t.untyped_storage().data_ptr() for t in resident}
        super().__init__(self._pack, self._unpack)

    def _pack(self, tensor: Tensor):
        if (tensor.numel() * tensor.element_size() < self._min_bytes or tensor.is_sparse
                or tensor.untyped_storage().data_ptr() in self._resident):
            return tensor
        known = self._known.get(id(tensor))
        if known is not None and known[0]() is tensor and known[1] == tensor._version:
            host = known[2]
        else:
            side = None
            if tensor.is_cuda:
                side = self._side.get(tensor.device) or self._side.setdefault(
                    tensor.device, torch.cuda.Stream(tensor.device))
            host = _Host(tensor.detach(), side)
            self._known[id(tensor)] = (weakref.ref(tensor), tensor._version, host)
            self.copies += 1
        self.saved += 1
        return host

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        # Nothing is saved past here; the graph holds each copy until backward uses it.
        # Held here too, they would live as long as these hooks do, which (a pack hook
        # that is a method of its hooks object) is until a garbage collection: the first
        # try at 131,072 kept a second step's copies beside the first's and the host ran
        # out of memory.
        self._known.clear()

    @staticmethod
    def _unpack(packed) -> Tensor:
        return packed.back() if isinstance(packed, _Host) else packed



class OptimizerOffload:
    """AdamW's state in pinned host memory between steps, on the device only for the
    optimizer's step: from the second step on it would sit beside the forward and
    backward (7.2 GiB of kimi-k2's, which took 131,072 x 5 past a 96 GiB cap at step 2).
    Each state tensor has one host buffer, made once. Both copies are queued on the
    current stream (the step's kernels and the next copy into a buffer keep their order);
    to_host waits for its copies, so whatever reads the state next (a checkpoint) reads
    it whole."""

    def __init__(self, optimizer: torch.optim.Optimizer):
        self.optimizer = optimizer
        self._host: dict[tuple[int, str], Tensor] = {}

    def _tensors(self):
        for param, state in self.optimizer.state.items():
            if hasattr(param, "full_tensor"):  # sharded: each rank's share is small
                continue
            for key, value in state.items():
                if torch.is_tensor(value):
                    yield param, state, key, value

    def to_device(self) -> None:
        for param, state, key, value in list(self._tensors()):
            if value is self._host.get((id(param), key)):
                state[key] = value.to(param.device, non_blocking=True, copy=True)

    def to_host(self) -> None:
        copied = False
        for param, state, key, value in list(self._tensors()):
            host = self._host.get((id(param), key))
            if value is host:
                continue
            if host is None:
                host = self._host.setdefault((id(param), key), torch.empty_like(
                    value, device="cpu", pin_memory=value.is_cuda))
            state[key], copied = host.copy_(value, non_blocking=True), True
        if copied and torch.cuda.is_available():
            torch.cuda.synchronize()
