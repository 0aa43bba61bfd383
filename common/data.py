"""Samplers and loaders whose order and randomness are a pure function of (seed, epoch, position).

Why: exact mid-epoch resume with DataLoader workers. The sampler is the only source of data
randomness: it hands each sample a key `(index, seed, epoch)` and the dataset draws its random
crop/augmentation from `sample_rng(key)`. Worker processes, prefetching and restarts then cannot
change what a sample looks like, and resuming is `set_epoch(e)` + `skip(consumed)`.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler

from common.errors import ConfigError
from common.workers import end_ignoring_workers_at_exit, ignore_stop_signals

SampleKey = tuple[int, int, int]  # (index, seed, epoch)


def sample_rng(key: int | Sequence[int]) -> tuple[int, np.random.Generator]:
    """`(index, seed, epoch)` → (index, a generator unique to that sample in that epoch).
    A plain int index (validation, inference) gets a fixed generator, so crops are repeatable."""
    if isinstance(key, (int, np.integer)):
        index, seed, epoch = int(key), 0, 0
    else:
        index, seed, epoch = (int(k) for k in key)
    return index, np.random.default_rng([seed, epoch, index])


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


class ResumableSampler(DistributedSampler):
    """A DistributedSampler (shuffle per `set_epoch`, sharded by rank) that yields sample keys and
    can skip the samples a resumed run already consumed in the current epoch."""

    def __init__(
        self,
        dataset: Dataset,
        shuffle: bool = True,
        seed: int = 0,
        num_replicas: int | None = None,
        rank: int | None = None,
        drop_last: bool = False,
    ) -> None:
        world, this_rank = _world()
        super().__init__(
            dataset,
            num_replicas=world if num_replicas is None else num_replicas,
            rank=this_rank if rank is None else rank,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
        )
        self._skip = 0

    def skip_samples(self, n_samples: int) -> None:
        """Skip the first `n_samples` of this rank's order for the current epoch (next iter only)."""
        self._skip = max(0, int(n_samples))

    def __iter__(self) -> Iterator[SampleKey]:
        indices = list(super().__iter__())
        start, self._skip = self._skip, 0
        for index in indices[start:]:
            yield (index, self.seed, self.epoch)

    def __len__(self) -> int:
        return self.num_samples - self._skip


class BucketBatchSampler(Sampler[list[SampleKey]]):
    """Batches of similar length (less padding; padded to `BucketShapes`, few distinct shapes, so
    torch.compile and CUDA graphs do not recompile every batch). Sharded by rank, resumable.

    `max_frames` > 0 (a frame budget, as F5's DynamicBatchSampler batches): a batch holds at most
    `max_frames` padded frames, counting every item padded to its bucket's longest item rounded up
    to `frame_multiple` (what `BucketShapes` pads to; padding to the batch's own longest is never
    more). A bucket of long items thus makes smaller batches instead of an out-of-memory error;
    `batch_size` stays the upper bound (the short buckets). An item longer than the whole budget
    is a batch alone. Each bucket's batch size is fixed, so the number of batches per epoch is the
    same every epoch (steps_per_epoch) and the order stays a pure function of (seed, epoch)."""

    def __init__(
        self,
        lengths: Sequence[int],
        batch_size: int,
        num_buckets: int = 8,
        shuffle: bool = True,
        seed: int = 0,
        num_replicas: int | None = None,
        rank: int | None = None,
        drop_last: bool = False,
        max_frames: int = 0,
        frame_multiple: int = 1,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if max_frames < 0 or frame_multiple < 1:
            raise ValueError(f"max_frames must be >= 0 and frame_multiple >= 1, got {max_frames}, {frame_multiple}")
        if len(lengths) == 0:
            raise ValueError("BucketBatchSampler got an empty dataset")
        world, this_rank = _world()
        self.lengths = np.asarray(lengths)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.num_replicas = world if num_replicas is None else num_replicas
        self.rank = this_rank if rank is None else rank
        self.drop_last = drop_last
        self.epoch = 0
        self._skip = 0
        order = np.argsort(self.lengths, kind="stable")
        num_buckets = max(1, min(num_buckets, len(order)))
        self.buckets = [b for b in np.array_split(order, num_buckets) if len(b)]
        # The longest item of each bucket: pad to it for a fixed shape per bucket.
        self.boundaries = sorted({int(self.lengths[b].max()) for b in self.buckets})
        self.max_frames = max_frames
        # items per batch of each bucket: batch_size, or fewer where the frame budget says so
        self.bucket_batch = [batch_size if not max_frames else
                             min(batch_size, max(1, max_frames // round_up(int(self.lengths[b].max()), frame_multiple)))
                             for b in self.buckets]

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def skip_batches(self, n_batches: int) -> None:
        """Skip the first `n_batches` of this rank's batches for the current epoch (next iter only)."""
        self._skip = max(0, int(n_batches))

    def _all_batches(self) -> list[list[int]]:
        rng = np.random.default_rng([self.seed, self.epoch])
        batches: list[list[int]] = []
        for bucket, size in zip(self.buckets, self.bucket_batch):
            items = rng.permutation(bucket) if self.shuffle else bucket
            for i in range(0, len(items), size):
                chunk = items[i : i + size].tolist()
                if len(chunk) == size or not self.drop_last:
                    batches.append(chunk)
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        # Equal batch count on every rank, else DDP ranks deadlock at the epoch end.
        per_rank = len(batches) // self.num_replicas
        if per_rank == 0:
            budget = f" (at most {self.max_frames} frames a batch)" if self.max_frames else ""
            raise ConfigError(f"batch_size {self.batch_size}{budget}: {len(self.lengths)} training items make {len(batches)} "
                              f"batch(es) an epoch, fewer than the {self.num_replicas} processes that each need one; "
                              "lower batch_size (or the number of GPUs), or add data")
        return batches[self.rank : per_rank * self.num_replicas : self.num_replicas]

    def __iter__(self) -> Iterator[list[SampleKey]]:
        batches = self._all_batches()
        start, self._skip = self._skip, 0
        for batch in batches[start:]:
            yield [(i, self.seed, self.epoch) for i in batch]

    def __len__(self) -> int:
        return len(self._all_batches()) - self._skip


def round_up(n: int, multiple: int) -> int:
    return int(math.ceil(n / multiple) * multiple)


class BucketShapes:
    """The fixed (text, frames) size of each length bucket, so a run sees a handful of batch shapes
    (cudnn.benchmark tunes each shape once; torch.compile compiles each once) instead of one per batch.

    `boundaries` are `BucketBatchSampler.boundaries` (longest item per bucket) rounded up to
    `frame_multiple`; the text length for a frame boundary is the longest text among ALL items that
    short or shorter (so it always fits), rounded up to `text_multiple`."""

    def __init__(self, frames: Sequence[int], n_text: Sequence[int], boundaries: Sequence[int],
                 frame_multiple: int = 16, text_multiple: int = 8) -> None:
        self.frame_bounds = sorted({round_up(b, frame_multiple) for b in boundaries})
        order = np.argsort(frames)
        sorted_frames = np.asarray(frames)[order]
        running_max_text = np.maximum.accumulate(np.asarray(n_text)[order])
        self.text_bounds = []
        for fb in self.frame_bounds:
            k = int(np.searchsorted(sorted_frames, fb, side="right")) - 1
            self.text_bounds.append(round_up(int(running_max_text[max(k, 0)]), text_multiple))
        self.frame_multiple, self.text_multiple = frame_multiple, text_multiple

    def shapes(self) -> list[tuple[int, int]]:
        """Every (text, frames) shape a batch can have."""
        return list(zip(self.text_bounds, self.frame_bounds))

    def shape_for(self, max_frames: int, max_text: int) -> tuple[int, int]:
        i = bisect.bisect_left(self.frame_bounds, max_frames)
        if i < len(self.frame_bounds) and max_text <= self.text_bounds[i]:
            return self.text_bounds[i], self.frame_bounds[i]
        # Longer than every bucket (an item not seen when the buckets were made): still a rounded shape.
        return round_up(max_text, self.text_multiple), round_up(max_frames, self.frame_multiple)


def make_loader(
    dataset: Dataset,
    batch_size: int | None = None,
    sampler: Sampler | None = None,
    batch_sampler: Sampler | None = None,
    num_workers: int = 0,
    prefetch_factor: int | None = 2,
    pin_memory: bool = False,
    persistent_workers: bool = False,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    seed: int = 0,
    drop_last: bool = False,
) -> DataLoader:
    """A DataLoader with the config's settings applied honestly: prefetch and persistent workers
    only exist with workers, pin_memory only helps with CUDA, and an explicit generator keeps the
    global RNG untouched (a DataLoader without one draws from it at every `iter()`). Its workers
    leave SIGINT/SIGTERM to the trainer, which saves first, and are killed when the process ends
    (`common.workers`)."""
    kwargs: dict[str, Any] = {
        "num_workers": num_workers,
        "pin_memory": bool(pin_memory and torch.cuda.is_available()),
        "collate_fn": collate_fn,
        "generator": torch.Generator().manual_seed(seed),
    }
    if num_workers > 0:
        kwargs["worker_init_fn"] = ignore_stop_signals
        end_ignoring_workers_at_exit()
        kwargs["prefetch_factor"] = prefetch_factor
        kwargs["persistent_workers"] = persistent_workers
    if batch_sampler is not None:
        return DataLoader(dataset, batch_sampler=batch_sampler, **kwargs)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, drop_last=drop_last, **kwargs)
