"""Batch samplers (random, length-bucketed, token-budget, packed): deterministic for ``(seed, epoch)`` so a resume
replays the remaining batches, ``set_epoch`` reshuffles, and DDP rank r of W takes global batches r, r+W, ...
(cut to a multiple of W: one extra step hangs the all-reduce). Numpy only."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import numpy as np

Batches = list[list[int]]


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def as_lengths(lengths: Sequence[int] | np.ndarray) -> np.ndarray:
    """A 1-D int64 array of token counts (validated: no negatives)."""
    arr = np.asarray(lengths, dtype=np.int64).reshape(-1)
    if arr.size and int(arr.min()) < 0:
        raise ValueError(f"lengths must be >= 0, got a minimum of {int(arr.min())}")
    return arr


class _EpochBatchSampler:
    """Shared machinery: per-epoch caching, the longest batch first, drop_last and DDP sharding."""

    def __init__(
        self,
        rows: np.ndarray | int,
        seed: int,
        rank: int,
        world_size: int,
        shuffle: bool = True,
        drop_last: bool = False,
    ) -> None:
        """``rows``: the rows' lengths (``as_lengths``), or how many rows there are when their lengths do not matter."""
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
        self.lengths = None if isinstance(rows, int) else rows
        self.num_rows = rows if isinstance(rows, int) else len(rows)
        self.seed, self.shuffle, self.drop_last, self.rank, self.world_size = seed, shuffle, drop_last, rank, world_size
        self.epoch = 0
        self._cached: tuple[int, Batches] | None = None  # (epoch, this rank's batches): len() and iter() agree

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _global_batches(self, rng: np.random.Generator) -> Batches:
        raise NotImplementedError

    def global_batches(self, epoch: int | None = None) -> Batches:
        """All ranks' batches of an epoch in single-process order (what ``world_size=1`` would yield)."""
        epoch = self.epoch if epoch is None else epoch
        # One stream per (seed, epoch): independent of call order, so a fresh process reproduces any epoch.
        rng = np.random.default_rng([self.seed, epoch])
        batches = [b for b in self._global_batches(rng) if b]
        lengths = self.lengths
        if lengths is not None and self.shuffle and len(batches) > 1:
            # The longest batch goes first, so an out-of-memory error shows up at step 0, not hours in.
            longest = max(range(len(batches)), key=lambda i: int(lengths[batches[i]].max()))
            batches[0], batches[longest] = batches[longest], batches[0]
        return batches

    def batches(self) -> Batches:
        """This rank's batches for the current epoch."""
        if self._cached is None or self._cached[0] != self.epoch:
            batches = self.global_batches()
            usable = len(batches) // self.world_size * self.world_size
            self._cached = (self.epoch, batches[self.rank : usable : self.world_size])
        return self._cached[1]

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches())

    def __len__(self) -> int:
        return len(self.batches())

    def _cut(self, order: np.ndarray, batch_size: int) -> Batches:
        batches = [order[i : i + batch_size].tolist() for i in range(0, len(order), batch_size)]
        if self.drop_last and batches and len(batches[-1]) < batch_size:
            batches.pop()
        return batches

    def _sorted_chunks(self, rng: np.random.Generator, rows: int, *, descending: bool) -> list[np.ndarray]:
        """The rows shuffled, cut into mega-batches of ``rows``, each sorted by length (stable: ties stay random)."""
        assert self.lengths is not None
        order = rng.permutation(self.num_rows)
        chunks = [order[i : i + rows] for i in range(0, len(order), rows)]
        return [c[np.argsort(-self.lengths[c] if descending else self.lengths[c], kind="stable")] for c in chunks]


class RandomBatchSampler(_EpochBatchSampler):
    """Plain batches of ``batch_size`` rows in random (or, with ``shuffle=False``, original) order."""

    def __init__(
        self,
        num_rows: int,
        batch_size: int,
        *,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = False,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        super().__init__(int(num_rows), seed, rank, world_size, shuffle=shuffle, drop_last=drop_last)
        self.batch_size = batch_size

    def _global_batches(self, rng: np.random.Generator) -> Batches:
        order = rng.permutation(self.num_rows) if self.shuffle else np.arange(self.num_rows)
        return self._cut(order, self.batch_size)


class BucketSampler(_EpochBatchSampler):
    """Length-grouped batches: shuffled rows in mega-batches of ``mega_batch_factor * batch_size`` sorted by length,
    cut into batches whose order is shuffled. Cost: an argsort per epoch (~1 ms per 10k rows)."""

    def __init__(
        self,
        lengths: Sequence[int] | np.ndarray,
        batch_size: int,
        *,
        seed: int = 0,
        mega_batch_factor: int = 50,
        drop_last: bool = True,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if batch_size < 1 or mega_batch_factor < 1:
            raise ValueError(f"batch_size and mega_batch_factor must be >= 1, got {batch_size}, {mega_batch_factor}")
        super().__init__(as_lengths(lengths), seed, rank, world_size, drop_last=drop_last)
        self.batch_size, self.mega_batch_factor = batch_size, mega_batch_factor

    def _global_batches(self, rng: np.random.Generator) -> Batches:
        # Only the final mega-batch can end in a partial batch, because the mega-batch is a multiple of ``batch_size``.
        chunks = self._sorted_chunks(rng, self.batch_size * self.mega_batch_factor, descending=True)
        batches = self._cut(np.concatenate(chunks) if chunks else np.arange(0), self.batch_size)
        return [batches[i] for i in rng.permutation(len(batches))]


class TokenBudgetSampler(_EpochBatchSampler):
    """Batches of roughly constant tokens (rows x padded length <= ``max_tokens``) from length-sorted mega-batches of
    ``mega_batch_rows``; a row over ``max_tokens`` gets a batch of its own."""

    def __init__(
        self,
        lengths: Sequence[int] | np.ndarray,
        max_tokens: int,
        *,
        seed: int = 0,
        max_batch_size: int | None = None,
        pad_to_multiple_of: int = 1,
        mega_batch_rows: int | None = None,
        drop_last: bool = False,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        arr = as_lengths(lengths)
        super().__init__(arr, seed, rank, world_size, drop_last=drop_last)
        self.max_tokens, self.max_batch_size, self.pad_to_multiple_of = max_tokens, max_batch_size, pad_to_multiple_of
        if mega_batch_rows is None:
            # ~50 average batches per mega-batch, as in BucketSampler.
            mean_len = max(float(arr.mean()) if arr.size else 1.0, 1.0)
            mega_batch_rows = max(1, int(50 * max_tokens / mean_len))
        self.mega_batch_rows = mega_batch_rows

    def _global_batches(self, rng: np.random.Generator) -> Batches:
        chunks = self._sorted_chunks(rng, self.mega_batch_rows, descending=False)  # the newest row is the longest
        batches = [batch for chunk in chunks for batch in self._pack(chunk)]
        if self.drop_last and batches:
            batches.pop()  # the final batch of the final mega-batch is the only one that may be short of the budget
        return [batches[i] for i in rng.permutation(len(batches))]

    def _pack(self, ascending: np.ndarray) -> Batches:
        assert self.lengths is not None
        batches: Batches = []
        current: list[int] = []
        for idx in ascending.tolist():
            padded = round_up(max(int(self.lengths[idx]), 1), self.pad_to_multiple_of)
            full = (len(current) + 1) * padded > self.max_tokens
            if current and (full or (self.max_batch_size is not None and len(current) >= self.max_batch_size)):
                batches.append(current)
                current = []
            current.append(idx)
        if current:
            batches.append(current)
        return batches


def packing_layout(lengths: Sequence[int] | np.ndarray, batch_size: int, width: int | None) -> tuple[int, int]:
    """(tokens per bin, bins per micro-batch) of packed batches in rows of ``width`` (None: one row): a batch holds
    the example tokens of ``batch_size`` bucketed rows on average, and its peak stays <= batch_size x width."""
    arr = as_lengths(lengths)
    budget = max(1, math.ceil(batch_size * float(arr.mean()))) if arr.size else batch_size
    rows = min(batch_size, -(-budget // width)) if width else 1
    return min(width or budget, -(-budget // rows)), rows


class PackingSampler(_EpochBatchSampler):
    """Batches of ``rows`` bins, each bin whole examples whose tokens sum to at most ``width``: first-fit decreasing
    within shuffled mega-batches of ~50 batches (tight bins, random company), then the bins shuffled. An example
    longer than ``width`` gets a bin of its own. Deterministic for (seed, epoch) and DDP-sharded like the others."""

    def __init__(
        self,
        lengths: Sequence[int] | np.ndarray,
        width: int,
        rows: int = 1,
        *,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if width < 1 or rows < 1:
            raise ValueError(f"width and rows must be >= 1, got {width}, {rows}")
        arr = as_lengths(lengths)
        super().__init__(arr, seed, rank, world_size)
        self.width, self.rows = width, rows
        self.mega_rows = max(1, int(50 * rows * width / max(float(arr.mean()) if arr.size else 1.0, 1.0)))

    def _global_batches(self, rng: np.random.Generator) -> Batches:
        assert self.lengths is not None
        bins: Batches = []
        for chunk in self._sorted_chunks(rng, self.mega_rows, descending=True):
            room: list[int] = []
            first = len(bins)
            for idx in chunk.tolist():
                n = max(1, int(self.lengths[idx]))
                fit = next((b for b, free in enumerate(room) if free >= n), None)
                if fit is None:
                    bins.append([idx])
                    room.append(self.width - n)
                else:
                    bins[first + fit].append(idx)
                    room[fit] -= n
        bins = [bins[i] for i in rng.permutation(len(bins))]
        return [[i for b in bins[at : at + self.rows] for i in b] for at in range(0, len(bins), self.rows)]


class SortedBatchSampler(_EpochBatchSampler):
    """Eval/predict batches in length order, every epoch; ``out[order] = outputs`` restores the original rows."""

    def __init__(self, lengths: Sequence[int] | np.ndarray, batch_size: int, *, descending: bool = True) -> None:
        arr = as_lengths(lengths)
        super().__init__(arr, 0, 0, 1, shuffle=False)
        self.batch_size = batch_size
        # Longest first: the peak-memory batch runs first, and the tail of small batches finishes quickly.
        self.order = np.argsort(-arr if descending else arr, kind="stable")

    def _global_batches(self, rng: np.random.Generator) -> Batches:
        return self._cut(self.order, self.batch_size)
