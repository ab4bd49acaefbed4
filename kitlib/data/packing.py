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

from kitlib.data.samplers import round_up
from kitlib.models import IGNORE_INDEX


def packing_supported() -> bool:
    """Whether this transformers builds the per-example mask from position_ids (4.54+: masking_utils)."""
    try:
        from transformers.masking_utils import find_packed_sequence_indices  # noqa: F401
    except ImportError:
        return False
    return True


class PackingCollator:
    """Items ``(ids, labels)`` (labels per token, or None) laid end to end in rows of up to ``width`` tokens (next
    fit, in the sampler's order: its bins never need more rows), or all in one row (``width=None``: flash-attn's
    varlen kernel reads packed sequences only from a single row). Yields input_ids, position_ids (restarting per
    example) and labels (-100 on each example's first token); a row's padding is a segment of its own (positions
    from 0, labels -100), so nothing attends to it or is scored. A class, so spawned workers can pickle it."""

    def __init__(self, width: int | None = None, pad_id: int = 0, pad_to_multiple_of: int = 1) -> None:
        self.width, self.pad_id, self.multiple = width, pad_id, max(1, pad_to_multiple_of)

    def __call__(self, items: Sequence[Any]) -> dict[str, torch.Tensor]:
        rows: list[list[Any]] = [[]]
        used = 0
        for item in items:
            n = len(item[0])
            if self.width is not None and rows[-1] and used + n > self.width:
                rows.append([])
                used = 0
            rows[-1].append(item)
            used += n
        scored = items[0][1] is not None
        width = round_up(max(sum(len(item[0]) for item in row) for row in rows), self.multiple)
        ids = np.full((len(rows), width), self.pad_id, dtype=np.int64)
        positions = np.zeros((len(rows), width), dtype=np.int64)
        labels = np.full((len(rows), width), IGNORE_INDEX, dtype=np.int64)
        for r, row in enumerate(rows):
            at = 0
            for item in row:
                n = len(item[0])
                ids[r, at : at + n], positions[r, at : at + n] = item[0], np.arange(n)
                if scored:
                    labels[r, at + 1 : at + n] = np.asarray(item[1])[1:n]
                at += n
            positions[r, at:] = np.arange(width - at)  # the padding: one more segment
        batch = {"input_ids": torch.from_numpy(ids), "position_ids": torch.from_numpy(positions)}
        if scored:
            batch["labels"] = torch.from_numpy(labels)
        return batch
