"""The hidden-state data set on disk, and the loader that feeds packed batches to the loop.

A data directory, as `trackside extract` writes it:

    dataset.json               hidden_size, vocab_size, num_layers, layers (captured),
                               dtype, num_samples, lengths (per sample), total_tokens, model
    samples/<i>.safetensors    input_ids [n] long, loss_mask [n] bool,
                               aux_hidden [n, 3H] (the captured layers, concatenated),
                               final_hidden [n, H] (after the verifier's final norm),
                               verifier_ids [n] long (the verifier's argmax there; data
                               extracted before it was kept lacks it)
    verifier.safetensors       embed_tokens [vocab, H], lm_head [vocab, H]
    token_counts.safetensors   counts [vocab]: loss-bearing token frequencies, for the
                               draft vocabulary

Every file is written to a temporary name and renamed, and dataset.json comes last: a
directory with dataset.json is complete.
"""
from __future__ import annotations

import json
import os
import queue
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from training.packing import Sample, collate, plan_rows

DATASET_JSON = "dataset.json"
VERIFIER_FILE = "verifier.safetensors"
TOKEN_COUNTS_FILE = "token_counts.safetensors"


class DatasetError(Exception):
    pass


def sample_path(root: Path, index: int) -> Path:
    return root / "samples" / f"{index:08d}.safetensors"


def write_tensors_atomic(path: Path, tensors: dict[str, Tensor]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    save_file({k: v.contiguous() for k, v in tensors.items()}, tmp)
    os.replace(tmp, path)


def write_json_atomic(path: Path, obj: dict) -> None:
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, path)


class Dataset:
    def __init__(self, root: Path | str):
        self.root = Path(root)
        info_path = self.root / DATASET_JSON
        if not info_path.is_file():
            raise DatasetError(f"{self.root} is not a data set (no {DATASET_JSON}); "
                               "make one with `trackside extract`")
        self.info = json.loads(info_path.read_text())
        self.lengths: list[int] = self.info["lengths"]
        self.hidden_size: int = self.info["hidden_size"]
        self.vocab_size: int = self.info["vocab_size"]

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> Sample:
        return load_file(sample_path(self.root, index))

    def verifier(self) -> dict[str, Tensor]:
        """embed_tokens and lm_head of the verifier, [vocab, H] each."""
        return load_file(self.root / VERIFIER_FILE)

    def token_counts(self) -> Tensor:
        return load_file(self.root / TOKEN_COUNTS_FILE)["counts"]


@dataclass
class Position:
    """Where the loader stands: the next global batch is `batch` of epoch `epoch`."""
    epoch: int = 0
    batch: int = 0

    def state_dict(self) -> dict:
        return asdict(self)


class Loader:
    """Epochs of packed batches, the same plan on every rank, each rank its own rows.

    The packing plan is computed once; each epoch shuffles its rows with a generator
    seeded by (seed, epoch), so a position alone says what comes next. A global batch is
    batch_rows × world_size consecutive rows of that order and rank r takes its slice, so
    N ranks see together exactly the rows one process with N × batch_rows would.
    Batches are loaded and collated on a background thread, `prefetch` ahead, into pinned
    memory when pin_memory (for a CUDA device).
    """

    def __init__(self, dataset: Dataset, max_seq_len: int, batch_rows: int, *, seed: int,
                 rank: int = 0, world_size: int = 1, prefetch: int = 2,
                 pin_memory: bool = False):
        self.dataset = dataset
        self.max_seq_len = max_seq_len
        self.batch_rows = batch_rows
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.prefetch = prefetch
        self.pin_memory = pin_memory
        self.plan = plan_rows(dataset.lengths, max_seq_len)
        self.steps_per_epoch = len(self.plan) // (batch_rows * world_size)
        if self.steps_per_epoch == 0:
            raise DatasetError(
                f"the data set packs into {len(self.plan)} rows of {max_seq_len} tokens, "
                f"fewer than one global batch of {batch_rows * world_size} rows")

    def _order(self, epoch: int) -> list[int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(len(self.plan), generator=g).tolist()

    def _batches(self, start: Position):
        epoch, batch = start.epoch, start.batch
        while True:
            if batch >= self.steps_per_epoch:  # also a position from a differently packed run
                epoch, batch = epoch + 1, 0
            order = self._order(epoch)
            first = (batch * self.world_size + self.rank) * self.batch_rows
            rows = [[self.dataset[i] for i in self.plan[r]]
                    for r in order[first:first + self.batch_rows]]
            packed = collate(rows, self.max_seq_len, self.pin_memory)
            yield packed, epoch, Position(epoch, batch + 1)
            batch += 1

    def iterate(self, start: Position):
        """Yields (batch, epoch, position after it) forever, from `start`."""
        items: queue.Queue = queue.Queue(maxsize=self.prefetch)
        stop = threading.Event()

        def put(item) -> bool:
            while not stop.is_set():
                try:
                    items.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        def produce() -> None:
            try:
                for item in self._batches(start):
                    if not put(item):
                        return
            except BaseException as exc:  # handed to the consumer, which re-raises it
                put(exc)

        thread = threading.Thread(target=produce, name="prefetch", daemon=True)
        thread.start()
        try:
            while True:
                item = items.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()
            thread.join()


