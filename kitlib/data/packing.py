"""Padding-free packing for causal-LM training: a batch is its examples laid end to end in one row, no padding.

    loader = make_train_loader(dataset, TrainConfig(batching="packed", ...), hw)  # PackingSampler + PackingCollator

Each example keeps its own positions (``position_ids`` restart at 0), and the batch carries no attention mask:
transformers then derives a block-diagonal causal mask from the restarts (SDPA, ``find_packed_sequence_indices``),
or cu_seqlens for flash-attn's varlen kernel, so no token attends across examples (tests/test_packing.py proves it
on logits). The first label of every example is -100: the token before it belongs to the previous example, and the
model's own one-position shift would otherwise score it. The loss stays the mean over scored tokens, counted by
fit's default_count_fn exactly as for padded rows; tokens/s counts the examples' own tokens (``PackedBatch``), not
the row-end padding, as a padded batch's attention mask does.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from kitlib.data.samplers import round_up
from kitlib.models import IGNORE_INDEX

# lazy: transformers (+0.6 s): only asked whether it masks packed rows or switches a model's attention.


def packing_supported() -> bool:
    """Whether this transformers builds the per-example mask from position_ids (4.54+: masking_utils)."""
    try:
        from transformers.masking_utils import find_packed_sequence_indices  # noqa: F401
    except ImportError:
        return False
    return True


FLASH = "flash_attention_2"  # transformers' name for flash-attn 2's kernels (varlen for packed sequences)


def packed_attention(device_type: str) -> str:
    """The attention packed rows train through, chosen here alone: flash-attn 2's varlen kernel where the flash_attn
    package is installed and the run trains on a CUDA GPU (transformers derives cu_seqlens from the position_ids
    restarts of a one-row batch, ``PackingCollator(width=None)``, and computes no attention across examples), else
    SDPA with the block-diagonal mask transformers builds from the same position_ids. The GPU side is reasoned, not
    measured: no GPU with flash_attn installed has run it (benchmarks/gpu_checks.py's packing check would)."""
    if device_type != "cuda" or importlib.util.find_spec("flash_attn") is None:
        return "sdpa"
    from transformers import PreTrainedModel

    return FLASH if hasattr(PreTrainedModel, "set_attn_implementation") else "sdpa"  # 4.56+ switches a built model


class PackedBatch(dict[str, torch.Tensor]):
    """A packed batch's tensors, and ``real_tokens``: its examples' own tokens, row-end padding not counted (no
    tensor can say it: an attention mask would turn transformers' packed-row mask off, and the padding's position_ids
    segment looks like an example's). model(**batch) sees only the tensors; DataLoader workers (pickle) and pinning
    (the loader calls a batch's own pin_memory) keep the count."""

    real_tokens: int | None = None

    def pin_memory(self) -> PackedBatch:
        pinned = PackedBatch({k: v.pin_memory() for k, v in self.items()})
        pinned.real_tokens = self.real_tokens
        return pinned


class PackingCollator:
    """Items ``(ids, labels)`` (labels per token, or None) laid end to end in rows of up to ``width`` tokens (next
    fit, in the sampler's order: its bins never need more rows), or all in one row (``width=None``: flash-attn's
    varlen kernel reads packed sequences only from a single row). Yields input_ids, position_ids (restarting per
    example) and labels (-100 on each example's first token); a row's padding is a segment of its own (positions
    from 0, labels -100), so nothing attends to it or is scored. A class, so spawned workers can pickle it."""

    def __init__(self, width: int | None = None, pad_id: int = 0, pad_to_multiple_of: int = 1) -> None:
        self.width, self.pad_id, self.multiple = width, pad_id, max(1, pad_to_multiple_of)

    def __call__(self, items: Sequence[Any]) -> PackedBatch:
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
        batch = PackedBatch(input_ids=torch.from_numpy(ids), position_ids=torch.from_numpy(positions))
        batch.real_tokens = sum(len(item[0]) for item in items)
        if scored:
            batch["labels"] = torch.from_numpy(labels)
        return batch
