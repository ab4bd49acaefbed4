"""Padding-free packing for causal-LM training: a batch is its examples laid end to end in one row, no padding.

    loader = make_train_loader(dataset, TrainConfig(batching="packed", ...), hw)  # PackingSampler + PackingCollator

Each example keeps its own positions (``position_ids`` restart at 0), and the batch carries no attention mask:
transformers then derives a block-diagonal causal mask from the restarts (SDPA, ``find_packed_sequence_indices``),
or cu_seqlens for flash-attn's varlen kernel, so no token attends across examples (tests/test_packing.py proves it
on logits). The first label of every example is -100: the token before it belongs to the previous example, and the
model's own one-position shift would otherwise score it. The loss stays the mean over scored tokens, counted by
fit's default_count_fn exactly as for padded rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from kitlib.data.samplers import Batches, _EpochBatchSampler, as_lengths
from kitlib.models import IGNORE_INDEX


def packing_supported() -> bool:
    """Whether this transformers builds the per-example mask from position_ids (4.54+: masking_utils)."""
    try:
        from transformers.masking_utils import find_packed_sequence_indices  # noqa: F401
    except ImportError:
        return False
    return True


class PackingSampler(_EpochBatchSampler):
    """Batches of whole examples whose tokens sum to at most ``max_tokens``: first-fit decreasing within shuffled
    mega-batches of ~50 batches (tight bins, random company), then the batches shuffled. An example longer than
    ``max_tokens`` gets a batch of its own. Deterministic for (seed, epoch) and DDP-sharded like the other samplers."""

    def __init__(
        self, lengths: Sequence[int] | np.ndarray, max_tokens: int, *, seed: int = 0, rank: int = 0, world_size: int = 1
    ) -> None:
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        arr = as_lengths(lengths)
        super().__init__(len(arr), seed=seed, shuffle=True, drop_last=False, rank=rank, world_size=world_size,
                         lengths=arr)  # fmt: skip
        self.max_tokens = max_tokens
        self.mega_rows = max(1, int(50 * max_tokens / max(float(arr.mean()) if arr.size else 1.0, 1.0)))

    def _global_batches(self, rng: np.random.Generator) -> Batches:
        assert self.lengths is not None
        order = rng.permutation(self.num_rows)
        batches: Batches = []
        for start in range(0, len(order), self.mega_rows):
            chunk = order[start : start + self.mega_rows]
            bins: Batches = []
            room: list[int] = []
            for idx in chunk[np.argsort(-self.lengths[chunk], kind="stable")].tolist():
                n = max(1, int(self.lengths[idx]))
                fit = next((b for b, free in enumerate(room) if free >= n), None)
                if fit is None:
                    bins.append([idx])
                    room.append(self.max_tokens - n)
                else:
                    bins[fit].append(idx)
                    room[fit] -= n
            batches.extend(bins)
        return [batches[i] for i in rng.permutation(len(batches))]


class PackingCollator:
    """Items ``(ids, labels)`` (labels per token, or None) -> one row: input_ids, position_ids (restarting per
    example) and labels (-100 on each example's first token), shape (1, total tokens). A class, so spawned workers
    can pickle it."""

    def __call__(self, items: Sequence[Any]) -> dict[str, torch.Tensor]:
        ids = [np.asarray(item[0], dtype=np.int64).reshape(-1) for item in items]
        positions = np.concatenate([np.arange(len(row), dtype=np.int64) for row in ids])
        batch = {"input_ids": torch.from_numpy(np.concatenate(ids))[None]}
        batch["position_ids"] = torch.from_numpy(positions)[None]
        if items and items[0][1] is not None:
            labels = np.concatenate([np.asarray(item[1], dtype=np.int64).reshape(-1)[: len(row)]
                                     for item, row in zip(items, ids, strict=True)])  # fmt: skip
            labels[positions == 0] = IGNORE_INDEX
            batch["labels"] = torch.from_numpy(labels)[None]
        return batch
