"""Padding-free causal-LM packing: examples end to end in a row, ``position_ids`` restarting per example."""

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
    """Packed rows' attention: flash-attn 2 varlen on CUDA where installed (reasoned), else SDPA with a block mask."""
    if device_type != "cuda" or importlib.util.find_spec("flash_attn") is None:
        return "sdpa"
    from transformers import PreTrainedModel

    return FLASH if hasattr(PreTrainedModel, "set_attn_implementation") else "sdpa"  # 4.56+ switches a built model


class PackedBatch(dict[str, torch.Tensor]):
    """A packed batch's tensors and ``real_tokens``, the examples' own tokens (row-end padding not counted)."""

    real_tokens: int | None = None

    def pin_memory(self) -> PackedBatch:
        pinned = PackedBatch({k: v.pin_memory() for k, v in self.items()})
        pinned.real_tokens = self.real_tokens
        return pinned


class PackingCollator:
    """Items ``(ids, labels)`` end to end in rows of <= ``width`` tokens; padding is its own segment, never attended."""

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
