"""Views of a DataLoader's batch order: skip the first k batches (mid-epoch resume) and shard batches across DDP ranks,
by wrapping the batch sampler (skipped or foreign batches are never loaded); the views share the original samplers."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sized
from typing import Any

import torch
from torch.utils.data import DataLoader, RandomSampler, Sampler

from kitlib.engine.checkpoint import set_rng_state
from kitlib.machine.distributed import DistEnv

# DataLoader arguments that carry over unchanged when only the batch order changes.
_LOADER_ARGS = (
    "num_workers",
    "collate_fn",
    "pin_memory",
    "timeout",
    "worker_init_fn",
    "multiprocessing_context",
    "generator",
    "persistent_workers",
    "pin_memory_device",
    "in_order",
)


def rebuild_loader(loader: DataLoader[Any], batch_sampler: Sampler[list[int]]) -> DataLoader[Any]:
    """A loader like ``loader`` (same dataset, collate, workers, pinning) that draws batches from ``batch_sampler``."""
    kwargs = {name: getattr(loader, name) for name in _LOADER_ARGS if hasattr(loader, name)}
    if loader.num_workers > 0:
        kwargs["prefetch_factor"] = loader.prefetch_factor
    # Keep DataLoader subclasses that add behaviour but no constructor arguments (kitlib's worker-crash fallback).
    cls = type(loader) if type(loader).__init__ is DataLoader.__init__ else DataLoader
    return cls(loader.dataset, batch_sampler=batch_sampler, **kwargs)


def _batch_sampler(loader: DataLoader[Any]) -> Sampler[list[int]]:
    if loader.batch_sampler is None:
        raise TypeError(
            "this DataLoader has no batch_sampler (batch_size=None or an IterableDataset), so kitlib cannot skip or "
            "shard its batches without loading them; build it with batch_size=... over a map-style Dataset"
        )
    return loader.batch_sampler  # type: ignore[return-value]


def seed_epoch_order(loader: DataLoader[Any], seed: int, epoch: int) -> None:
    """Make each epoch's batch order a pure function of (seed, epoch), so a resumed run replays it exactly."""
    for sampler in (loader.batch_sampler, loader.sampler):
        if callable(getattr(sampler, "set_epoch", None)):
            sampler.set_epoch(epoch)  # type: ignore[union-attr]
            return
    if isinstance(loader.sampler, RandomSampler):
        # The user's plain DataLoader(shuffle=True): give its sampler a seeded generator (torch would otherwise
        # draw a fresh seed from the global RNG at every iterator, which a resumed run cannot replay).
        loader.sampler.generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)


class SkipBatches(Sampler[list[int]]):
    """The batches of ``inner`` after the first ``skip``: index lists only, nothing loaded for them; ``inner`` is
    iterated from its start, so an RNG it draws from advances as in an uninterrupted epoch."""

    def __init__(self, inner: Sampler[list[int]], skip: int) -> None:
        if skip < 0:
            raise ValueError(f"skip must be >= 0, got {skip}")
        self.inner, self.skip = inner, skip

    def __iter__(self) -> Iterator[list[int]]:
        return itertools.islice(self.inner, self.skip, None)

    def __len__(self) -> int:
        return max(0, len(self.inner) - self.skip) if isinstance(self.inner, Sized) else 0

    def __getattr__(self, name: str) -> Any:  # set_epoch, world_size, rank, lengths, order... of the wrapped sampler
        if name == "inner":  # not yet set (e.g. during unpickling): avoid infinite recursion
            raise AttributeError(name)
        return getattr(self.inner, name)


class ShardBatches(Sampler[list[int]]):
    """Rank ``rank`` of ``world_size`` takes batches rank, rank+W, ... (W ranks x accumulation A equal one process x
    A*W). ``even`` (training) cuts the count to a multiple of W so no rank hangs in an all-reduce; an eval keeps all."""

    def __init__(self, inner: Sampler[list[int]], rank: int, world_size: int, *, even: bool = True) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} out of range for world_size {world_size}")
        self.inner, self.rank, self.world_size, self.even = inner, rank, world_size, even

    def __iter__(self) -> Iterator[list[int]]:
        usable = len(self.inner) // self.world_size * self.world_size if self.even else len(self.inner)  # type: ignore[arg-type]
        return itertools.islice(self.inner, self.rank, usable, self.world_size)

    def __len__(self) -> int:
        total = len(self.inner)  # type: ignore[arg-type]
        return total // self.world_size if self.even else len(range(self.rank, total, self.world_size))


def skip_batches(loader: DataLoader[Any], skip: int) -> DataLoader[Any]:
    """The rest of the current epoch after ``skip`` batches; the loader itself when ``skip`` is 0."""
    return loader if skip <= 0 else rebuild_loader(loader, SkipBatches(_batch_sampler(loader), skip))


def is_sharded(loader: DataLoader[Any]) -> bool:
    """True when the loader already splits data across ranks (DistributedSampler, kitlib's rank-aware samplers)."""
    for sampler in (loader.batch_sampler, loader.sampler):
        if getattr(sampler, "num_replicas", 1) > 1 or getattr(sampler, "world_size", 1) > 1:
            return True
    return False


def shard_batches(loader: DataLoader[Any], rank: int, world_size: int, *, even: bool = True) -> DataLoader[Any]:
    if world_size <= 1 or is_sharded(loader):
        return loader
    return rebuild_loader(loader, ShardBatches(_batch_sampler(loader), rank, world_size, even=even))


class DataViews:
    """fit's views of the data: ``base`` (the user's training loader: its samplers decide each epoch's order, and the
    views share them), this rank's shard of it (``train``), and of the eval set (``eval``; None without one)."""

    def __init__(self, train_loader: DataLoader[Any], eval_loader: DataLoader[Any] | None, env: DistEnv, *,
                 grad_accum_steps: int, eval_every_steps: int | None) -> None:  # fmt: skip
        self.base = train_loader
        self.train = shard_batches(train_loader, env.rank, env.world_size)
        self.eval = shard_batches(eval_loader, env.rank, env.world_size, even=False) if eval_loader else None
        if eval_every_steps and self.eval is None:
            raise ValueError(f"eval_every_steps={eval_every_steps} needs an eval_loader: pass fit(eval_loader=...)")
        self.windows_per_epoch = math.ceil(len(self.train) / grad_accum_steps)
        if self.windows_per_epoch == 0:
            raise ValueError("the training DataLoader is empty (with drop_last=True, fewer rows than one batch?)")
        self.resume_rng: dict[str, Any] | None = None  # a resumed run's RNG streams, applied once by ``epoch``

    def epoch(self, seed: int, epoch: int, batch_in_epoch: int) -> Iterator[Any]:
        """Epoch ``epoch``'s (0-based) batches from ``batch_in_epoch`` on, in its seeded order."""
        seed_epoch_order(self.base, seed, epoch)
        # A resumed run continues the RNG streams (dropout, ...) exactly where the checkpoint took them. A DataLoader
        # without a generator draws its base seed from the global RNG at iter(): an epoch-end checkpoint was taken
        # before this epoch's draw (restore first, the draw then repeats), a mid-epoch one after it (restore after).
        resume, self.resume_rng = self.resume_rng, None
        if resume is not None and batch_in_epoch == 0:
            set_rng_state(resume)
        batches = iter(skip_batches(self.train, batch_in_epoch))
        if resume is not None and batch_in_epoch > 0:
            set_rng_state(resume)
        return batches
