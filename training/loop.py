"""The training loop, top to bottom: set-up, resume, steps, checkpoints, the end; the same
for both drafters, whose own parts (building one, its step's forward and backward, its
step fields) are training/drafters/.

One process per GPU under torchrun, or one process alone (training/distributed.py). Each
rank trains on its slice of the global batch; the loss is normalised by the global count
of scored positions per TTT step (DFlash: per block offset), so N ranks compute exactly
what one process with the whole global batch would. Rank 0 writes metrics and
checkpoints; a checkpoint holds the whole drafter and its optimizer state by parameter
name, gathered from every rank, so it resumes at any world size and either sharding.

Exit codes: 0 done or stopped by SIGTERM/SIGINT (after a checkpoint), 3 CUDA out of memory
(placing the model, resuming or in a step), 4 max_nonfinite steps in a row not applied
(their loss or gradient not finite: training/nonfinite.py).
"""
from __future__ import annotations

import dataclasses
import errno
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from training import checkpoint, compile_cache, contract, drafters, durable
from training.config import DFlashConfig, DrafterConfig
from training.contract import EXIT_NONFINITE, EXIT_OK, EXIT_OOM
from training.data import Dataset, Loader
from training.device import peak_mem_gib, precision
from training.distributed import (all_reduce, gather_state, join_processes, leave_processes,
                                  live_state, spread)
from training.drafters.drafter import Drafter
from training.metrics import MetricsWriter
from training.mirror import Mirror
from training.nonfinite import Streak, Verdict
from training.offload import OptimizerOffload
from training.optimizer import GRAD_CLIP, LR, make_optimizer, optimizer_step, warmup_cosine
from training.params import PARAMS
from training.resume import ResumeError, resume, rng_state
from training.stop import StopRequest


@dataclass
class TrainConfig:
    data: Path
    run_dir: Path
    drafter: DrafterConfig | DFlashConfig
    steps: int | None = None  # exactly one of steps and epochs
    epochs: int | None = None
    max_seq_len: int = 2048
    ttt_steps: int = PARAMS["ttt_steps"].default
    ttt_decay: float = PARAMS["ttt_decay"].default
    lr: float = LR
    batch_rows: int = 1  # rows per rank per step
    device: str = "cpu"
    resume: bool = False
    # Another run's checkpoints dir to start from (a relaunch's parent's), its writer
    # waited for: the parent's checkpoint is still being made durable as this one starts.
    resume_from: Path | None = None
    # Seconds this process waited for the run it replaces to end (--after-pids), or None.
    replaced_run_s: float | None = None
    loss_chunk: int = 2048
    checkpoint_ttt: int = 0  # TTT steps recomputed in backward, the first ones (model.step_losses)
    freeze_lm_head: bool = False  # the draft head stays the verifier's (model.freeze_lm_head)
    # what backward keeps, and AdamW's state between steps, wait in pinned host memory
    offload_saved: bool = False
    fp8: bool = False  # the layers' projections in fp8 (training/fp8.py)
    gpu_mem_gib: float | None = None
    save_every: int = 0  # 0: only at the end and when stopped
    max_nonfinite: int = contract.MAX_NONFINITE  # skipped steps in a row that end the run
    seed: int = 0
    grad_clip: float = GRAD_CLIP
    weight_decay: float = 0.0
    export: Path | None = None
    # DFlash's knobs (training/drafters/dflash/step.py): the start event's `dflash`, by which
    # the dashboard and `fit --from-run` tell a DFlash run
    dflash: object | None = None
    sharding: str = "ddp"  # one of training.memory.state.SHARDINGS

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        del d["drafter"]
        d["model"] = self.drafter.to_dict()  # the key `trackside fit --from-run` reads
        return {k: str(v) if isinstance(v, Path) else v for k, v in d.items()}


def drafter_of(cfg: TrainConfig) -> Drafter:
    """The drafter cfg trains, as the registry finds it by its shape."""
    return drafters.spec_of(cfg.drafter).for_run(cfg)


def _tried_gib(error: Exception) -> float | None:
    m = re.search(r"Tried to allocate ([\d.]+) (GiB|MiB|KiB)", str(error))
    if not m:
        return None
    return float(m.group(1)) / {"GiB": 1, "MiB": 1024, "KiB": 1024**2}[m.group(2)]


def record_oom(metrics: MetricsWriter, cfg: TrainConfig, device: torch.device,
               error: torch.OutOfMemoryError) -> int:
    """The `oom` and `end` events and the message for an OOM; the exit code."""
    params = drafter_of(cfg).oom_params()
    metrics.write(contract.OOM, max_seq_len=cfg.max_seq_len, **params,
                  tried_gib=_tried_gib(error), peak_mem_gib=peak_mem_gib(device))
    metrics.write(contract.END, status=contract.ENDED_OOM)
    said = " ".join(f"{k}={v}" for k, v in params.items() if v is not None)
    print(f"train: CUDA out of memory at max_seq_len={cfg.max_seq_len} "
          f"{said}: {error}", file=sys.stderr, flush=True)
    return EXIT_OOM


NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def record_no_space(metrics: MetricsWriter, ckpt_root: Path, error: OSError) -> int:
    """A full disk (a checkpoint that did not fit, most likely): its half-written files
    removed, the newest whole checkpoint kept and named in the end event; the exit code."""
    durable.sweep(ckpt_root)  # the debris is ours: no writer of this run is alive
    kept = checkpoint.latest(ckpt_root)
    reason = f"no space left on device: {error}"
    try:  # the room the half-written checkpoint took is free again, most likely
        metrics.write(contract.END, status=contract.FAILED, reason=reason,
                      checkpoint=None if kept is None else str(kept))
    except OSError:
        pass
    print(f"train: {reason}; " + (f"the last whole checkpoint, {kept}, is kept" if kept
                                  else "no checkpoint was written before"),
          file=sys.stderr, flush=True)
    return contract.EXIT_FAILURE


def train(cfg: TrainConfig) -> int:
    # --- processes and device ---
    device, rank, world = join_processes(cfg.device, cfg.sharding)
    if device.type == "cuda" and cfg.gpu_mem_gib:
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(
            min(1.0, cfg.gpu_mem_gib * 2**30 / total), device)
    torch.manual_seed(cfg.seed)

    # Where a start-up's seconds went, in the start event: imports and the device (to
    # here), the data, the model, the resume; and the wait for the run it replaces.
    phases, phase_began = {}, time.time()
    phases["imports_device"] = phase_began - contract.PROCESS_STARTED - (cfg.replaced_run_s or 0.0)
    if cfg.replaced_run_s is not None:
        phases["replaced_run"] = cfg.replaced_run_s

    def phase_done(name: str) -> None:
        nonlocal phase_began
        now = time.time()
        phases[name], phase_began = now - phase_began, now

    # --- data ---
    dataset = Dataset(cfg.data)
    loader = Loader(dataset, cfg.max_seq_len, cfg.batch_rows, seed=cfg.seed, rank=rank,
                    world_size=world, pin_memory=device.type == "cuda")
    total_steps = cfg.steps or cfg.epochs * loader.steps_per_epoch
    warmup = max(1, min(100, total_steps // 10))
    drafting = drafter_of(cfg)

    metrics = MetricsWriter(cfg.run_dir / "metrics.jsonl" if rank == 0 else None)
    ckpt_root = cfg.run_dir / "checkpoints"
    stop, batches, status = None, None, contract.COMPLETED
    # Out of memory anywhere from here (placing the model, a resumed optimizer state, a
    # step) is an `oom` event and exit 3.
    try:
        phase_done("data")
        # --- model, optimizer ---
        drafter, unroll = drafting.build(dataset, device, (rank, world))
        unroll = spread(unroll, drafting.own_groups(drafter), cfg.sharding, device, world)
        # After sharding: fully_shard puts sharded parameters in the modules' place.
        trainable = {n: p for n, p in drafter.named_parameters() if p.requires_grad}
        optimizer = make_optimizer(trainable.values(), cfg.lr, device, cfg.weight_decay)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer,
                                                      warmup_cosine(warmup, total_steps))

        phase_done("model")
        # --- resume ---
        source = cfg.resume_from or (ckpt_root if cfg.resume else None)
        resumed = resume(source, rank, world, drafter, trainable, optimizer, scheduler,
                         cfg.freeze_lm_head, required=cfg.resume_from is not None)
        step, position = resumed.step, resumed.position
        phase_done("resume")
        if resumed.source == contract.RESUMED_FROM_DISK:
            phases["resume_wait"] = resumed.wait_s
        config = {**cfg.to_dict(), "total_steps": total_steps, "warmup_steps": warmup,
                  "global_batch_rows": cfg.batch_rows * world, "resumed_from_step": step,
                  "precision": precision(device),
                  "data_layers": dataset.info["layers"]}
        metrics.write(contract.START, config=config, process_started=contract.PROCESS_STARTED,
                      startup_s={k: round(v, 3) for k, v in phases.items()},
                      steps_per_epoch=loader.steps_per_epoch,
                      world_size=world, **({"resume_source": resumed.source} if resumed.source else {}))
        if rank == 0:
            print(f"train: run_dir={cfg.run_dir} steps={total_steps} "
                  f"steps_per_epoch={loader.steps_per_epoch} world_size={world} "
                  f"device={device.type} start_step={step}", flush=True)
        last_saved = step

        def state(optimizer_state: dict) -> dict:
            return {"step": step, "data": position.state_dict(), "rng": rng_state(),
                    "optimizer": optimizer_state, "scheduler": scheduler.state_dict()}

        # A stop's release-first save copies into this, built after the first step
        # (training/mirror.py); rank 0 of an unsharded run, which holds the whole state.
        mirror = None
        mirrored = cfg.sharding != "fsdp" and rank == 0 and cfg.export is None

        def mirror_said(built) -> None:
            what = f"train: for a stop, {built.nbytes / 2**30:.2f} GiB of RAM"
            if built.failed:
                print(f"{what} not made ready ({built.failed}): a stop copies the state "
                      "the slower way", flush=True)
            else:
                print(f"{what} ready in {built.build_s:.2f} s (mapped"
                      + (", page-locked)" if device.type == "cuda" else ")"), flush=True)

        def save(release_first: bool = False) -> None:
            """Checkpoint this step. `release_first` (stopping): get the state off the
            device into RAM (the mirror where it is built), and leave the durable write to
            a writer process, so this one can exit and free the device before the write is
            done (training/durable.py)."""
            nonlocal last_saved
            try:
                sharded = cfg.sharding == "fsdp"
                # FSDP gathers on every rank; unsharded, rank 0 holds it all and the others
                # would copy the whole state to the CPU for nothing.
                if last_saved != step and (sharded or rank == 0):
                    started = time.perf_counter()
                    images = None
                    if release_first and mirror is not None:
                        weights, optimizer_state = live_state(drafter, optimizer)
                        files, skeleton = checkpoint.tensor_files(weights, state(optimizer_state))
                        images = mirror.fill(files)
                    if images is None:
                        if release_first and mirror is not None:
                            print("train: stopping the ordinary way: the RAM for it "
                                  + (f"was not made ready ({mirror.failed})" if mirror.failed
                                     else "is not ready yet"), flush=True)
                        weights, optimizer_state = gather_state(drafter, optimizer, sharded)
                        files, skeleton = checkpoint.tensor_files(weights, state(optimizer_state))
                    else:
                        files = {}  # they are the mirror's images
                    off_device_s = time.perf_counter() - started
                    if rank == 0:
                        staged = checkpoint.stage(ckpt_root, step, files, skeleton, {
                            "drafter": cfg.drafter.to_dict(), "layers": dataset.info["layers"],
                            "num_layers": dataset.info["num_layers"],
                            "max_seq_len": cfg.max_seq_len, "ttt_steps": cfg.ttt_steps,
                            "freeze_lm_head": cfg.freeze_lm_head,
                            **drafting.checkpoint_extras()},
                            ram=release_first)
                        del weights, optimizer_state, files
                        stage_s = time.perf_counter() - started
                        writer = (durable.hand_off(staged, ckpt_root, step,
                                                   cfg.run_dir / "metrics.jsonl", images)
                                  if release_first else None)
                        if writer is None:
                            path = durable.publish(staged, ckpt_root, step, images)
                            metrics.write(contract.CHECKPOINT, step=step, path=str(path))
                        else:
                            metrics.write(contract.STAGED, step=step, writer=writer,
                                          stage_s=round(stage_s, 3))
                            where = "RAM made ready for it" if images else staged.parent
                            print(f"train: step {step}'s state written to {where} in "
                                  f"{stage_s:.2f} s ({off_device_s:.2f} s of it off the device), "
                                  f"{stop.since()}; checkpoint writer pid {writer} makes it "
                                  "durable", flush=True)
                last_saved = step
            finally:  # every rank meets here, also when rank 0 failed to write
                if world > 1:
                    dist.barrier()

        # --- the steps ---
        stop, batches = StopRequest(), loader.iterate(position)
        streak = Streak(cfg.max_nonfinite)
        keep_at = step + 1 if device.type == "cuda" and rank == 0 else None  # what it compiled, kept
        state_offload = OptimizerOffload(optimizer) if cfg.offload_saved else None
        while step < total_steps:
            started = time.perf_counter()
            host, epoch, next_position = next(batches)
            batch = host.to(device, non_blocking=True)
            # Positions are scored in units: TTT steps (EAGLE-3), block offsets (DFlash).
            scored, counts = drafting.forward_backward(unroll, batch, cfg.loss_chunk, world,
                                                       host)
            verdict = Verdict(scored, world)
            if state_offload is not None:
                state_offload.to_device()
            optimizer_step(optimizer, trainable.values(), cfg.grad_clip, apply=verdict)
            if state_offload is not None:
                state_offload.to_host()
            if verdict.what is not None:  # nothing applied; the batch is spent
                position, in_a_row = next_position, streak.skipped()
                metrics.write(contract.NONFINITE, step=step + 1, what=verdict.what,
                              in_a_row=in_a_row)
                if rank == 0:
                    print(f"train: step {step + 1} not applied: its {verdict.what} is not "
                          f"finite ({in_a_row} in a row, {cfg.max_nonfinite} end the run)",
                          flush=True)
                if streak.over:
                    status = contract.ENDED_NONFINITE
                    break
                if all_reduce([float(stop.requested)], world)[0] > 0:
                    status = contract.STOPPED
                    stop.under_way()
                    break
                continue
            streak.applied()
            lr = scheduler.get_last_lr()[0]
            scheduler.step()
            step, position = step + 1, next_position

            tokens = batch.input_ids.numel() - batch.pad_tokens
            # Each rank's peak in its own slot: the same all-reduce gathers them all.
            peaks = [0.0] * world
            peaks[rank] = peak_mem_gib(device)
            # Host values, summed over the ranks on the host; every unit's loss and
            # agreement sums came with the verdict's read
            sums = all_reduce(
                [tokens, batch.num_samples, batch.pad_tokens, float(stop.requested)] + peaks,
                world)
            peaks, stop_requested = sums[-world:], sums[-world - 1]
            K = len(scored)
            unit_loss = [verdict.sums[k] / max(counts[k], 1) for k in range(K)]
            unit_acc = [verdict.sums[K + k] / max(counts[k], 1) for k in range(K)]
            fields = drafting.step_fields(unit_loss, unit_acc, counts)
            tokens, samples, pad = sums[:3]
            rows = cfg.batch_rows * world
            elapsed = time.perf_counter() - started
            record = dict(
                step=step, epoch=epoch, **fields, lr=lr, grad_norm=verdict.grad_norm,
                tokens=int(tokens), tokens_per_s=tokens / elapsed,
                samples_per_row=samples / rows, pad_frac=pad / (rows * cfg.max_seq_len),
                peak_mem_gib=peaks[0])
            if world > 1:
                record["peak_mem_gib_ranks"] = peaks
            metrics.write(contract.STEP, **record)
            if rank == 0:
                print(f"step={step} epoch={epoch} loss={record['loss']:.4f} "
                      f"acc_0={unit_acc[0]:.3f} lr={lr:.3e} grad_norm={record['grad_norm']:.3f} "
                      f"tokens_per_s={record['tokens_per_s']:.0f} "
                      f"peak_mem_gib={record['peak_mem_gib']:.2f}", flush=True)
            if stop_requested > 0:  # any rank was asked to stop
                status = contract.STOPPED
                stop.under_way()
                break
            if cfg.save_every and step % cfg.save_every == 0:
                save()
            if mirrored and mirror is None:
                weights, optimizer_state = live_state(drafter, optimizer)
                files, _ = checkpoint.tensor_files(weights, state(optimizer_state))
                mirror = Mirror.start(files, device, on_done=mirror_said)
                del weights, optimizer_state, files
                if mirror.failed:
                    mirror_said(mirror)
            if step == keep_at and (said := compile_cache.keep()):
                print(f"train: {said}", flush=True)
        # An export reads the checkpoint as soon as the loop ends: written here, then.
        save(release_first=status == contract.STOPPED and cfg.export is None)
    except torch.OutOfMemoryError as error:
        return record_oom(metrics, cfg, device, error)
    except OSError as error:
        if error.errno not in NO_SPACE:
            metrics.write(contract.END, status=contract.FAILED)
            raise
        return record_no_space(metrics, ckpt_root, error)
    except ResumeError:  # nothing was run: the run's record stays as it ended
        raise
    except BaseException:
        metrics.write(contract.END, status=contract.FAILED)
        raise
    finally:
        if stop is not None:
            stop.restore()
            batches.close()

    if cfg.export is not None and rank == 0 and status != contract.ENDED_NONFINITE:
        drafters.spec_of(cfg.drafter).export(checkpoint.latest(ckpt_root), cfg.export,
                                             dataset.info.get("model") or None)
    metrics.write(contract.END, status=status)
    metrics.close()
    leave_processes()
    if mirror is not None:
        mirror.unpin()  # now, faster than the exit would (Mirror.unpin)
    if status == contract.STOPPED and rank == 0:
        print(f"train: stopped; exiting {stop.since()}", flush=True)
    if status == contract.ENDED_NONFINITE:
        if rank == 0:
            print(f"train: stopped after {cfg.max_nonfinite} steps in a row whose loss or "
                  f"gradient was not finite, none applied; the last step applied is {step}",
                  file=sys.stderr, flush=True)
        return EXIT_NONFINITE
    return EXIT_OK
