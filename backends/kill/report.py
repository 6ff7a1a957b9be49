"""What a kill did: the report the CLI prints and the dashboard shows, in words true on
the host it speaks of."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from backends import gpu, sanitize


@dataclass(frozen=True)
class GpuDelta:
    index: int
    before_mib: int | None
    after_mib: int | None


@dataclass
class KillReport:
    target: str
    session: str | None
    run_id: str | None
    signalled: list[int]  # got SIGTERM: the plan's processes still the same at the signal
    killed: list[int]  # still alive after the grace period: got SIGKILL
    survivors: list[int]  # alive even after SIGKILL
    gpus: list[GpuDelta]
    gpu_processes_before: list[gpu.GpuProcess]  # the run's processes holding GPU memory
    stragglers: list[gpu.GpuProcess]  # the run's processes still holding memory at the end
    # Processes outside the run holding GPU memory at the end: named, never signalled, and
    # no bar to `released`, which speaks of the run's pids only.
    other_holders: list[gpu.GpuProcess]
    released: bool | None  # None: no nvidia-smi to verify it with
    gpu_status: str
    gpu_message: str
    exit_status: int | None
    seconds: float  # the whole kill, first signal to verified release
    release_s: float | None  # last process exit to verified GPU release
    gpu_released_s: float | None = None  # first signal to verified GPU release
    # The trainer's last checkpoint: "durable", "lost" (its writer ended without it), "none
    # written", "not durable after N s", or None: not waited (not our trainer's node).
    checkpoint: str | None = None
    checkpoint_step: int | None = None
    checkpoint_durable_s: float | None = None  # first signal to the checkpoint seen durable
    notes: list[str] = field(default_factory=list)
    host: str | None = None
    nodes: list[KillReport] = field(default_factory=list)  # a multi-node run's other nodes

    def to_json(self) -> dict:
        return asdict(self)

    def verdict(self) -> str:
        """What the kill proved about the run's GPU memory, in words true on this host."""
        if self.survivors:
            return f"NOT released: {len(self.survivors)} process(es) still alive after SIGKILL"
        if self.stragglers:
            return "NOT released: the run's processes above still hold GPU memory"
        if self.gpu_status == gpu.GpuStatus.NO_GPU.name:
            return "stopped; no GPU on this host: no GPU memory to verify"
        if self.gpu_status == gpu.GpuStatus.NO_SMI.name:
            return "stopped; no nvidia-smi on this host: no GPU memory to verify"
        if self.released is False:
            return f"stopped, but GPU memory NOT verified: {self.gpu_message or self.gpu_status}"
        return f"released: the run holds no GPU memory (verified {self.release_s:.2f}s after its last process exited)"

    def times(self) -> str | None:
        """When the GPU was free and the checkpoint durable, counted from the first signal."""
        # "GPU released" only where the release was seen; elsewhere the run's processes ended.
        freed = "GPU released" if self.gpu_status == gpu.GpuStatus.OK.name else "processes ended"
        gpu_free = f"{freed} {self.gpu_released_s:.1f}s" if self.gpu_released_s is not None else None
        if self.checkpoint == "durable":
            written = f"checkpoint step {self.checkpoint_step} durable {self.checkpoint_durable_s:.1f}s"
        elif self.checkpoint is not None:
            written = f"checkpoint {self.checkpoint}" + (f" (step {self.checkpoint_step})" if self.checkpoint_step is not None else "")
        else:
            written = None
        said = [t for t in (gpu_free, written) if t]
        return ", ".join(said) + " after SIGTERM" if said else None


def holding(p: gpu.GpuProcess) -> str:
    """A process's hold on GPU memory in words: `pid 7 (python3) on GPU 1, 2,048 MiB`."""
    name = f" ({sanitize.line(p.name)})" if p.name else ""  # a process names itself
    where = f"GPU {p.gpu_index}" if p.gpu_index is not None else "an unlisted GPU"
    used = f"{p.used_mib:,} MiB" if p.used_mib is not None else "memory the driver does not size"
    return f"pid {p.pid}{name} on {where}, {used}"
