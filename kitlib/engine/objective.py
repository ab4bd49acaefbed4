"""What a step minimises: a micro-batch's mean loss and its item count, weighting accumulation by share."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from kitlib.engine.checkpoint import unwrap_model
from kitlib.models import IGNORE_INDEX

# lazy: transformers (+0.6 s): only is_causal_lm reads its model table

Batch = Any  # a Mapping of tensors (Hugging Face style), a tuple/list of tensors, or a tensor
LossFn = Callable[[nn.Module, Batch], torch.Tensor]  # mean loss over the items of one micro-batch
CountFn = Callable[[Batch], "int | torch.Tensor"]  # items that mean is over (may stay on the device: no sync)


def hf_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """The loss a Hugging Face model computes itself when the batch carries ``labels``."""
    if not isinstance(batch, Mapping):
        raise TypeError(
            "the default loss calls model(**batch).loss, so batches must be dicts of tensors; "
            "for a plain nn.Module pass loss_fn=lambda model, batch: ... to fit()"
        )
    if "labels" not in batch:
        raise KeyError(
            f"batch has no 'labels' (keys: {sorted(batch)}): add labels in the collate function, "
            "or pass loss_fn=... to fit()"
        )
    loss = model(**batch).loss
    if loss is None:
        raise ValueError(f"{type(model).__name__} returned no .loss although labels were given; pass loss_fn=...")
    return loss


def is_causal_lm(model: nn.Module) -> bool:
    """Causal LMs shift labels by one inside their loss, so the first label of each row is never scored."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    core = unwrap_model(model)
    core = getattr(core, "get_base_model", lambda: core)()  # a LoRA adapter (peft): the model it adapts
    names = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    return any(c.__name__ in names for c in type(core).__mro__)  # FSDP2's FSDPLlamaForCausalLM is a subclass


def rows(batch: Batch) -> int:
    """Number of rows (samples) in a batch of any supported shape."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0])
    if isinstance(batch, Mapping):
        for value in batch.values():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                return int(value.shape[0])
    if isinstance(batch, Sequence) and not isinstance(batch, str):
        for value in batch:
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                return int(value.shape[0])
            if isinstance(value, Sequence | Mapping) and not isinstance(value, str):
                return rows(value)
        return len(batch)
    raise TypeError(f"cannot count rows of a {type(batch).__name__} batch; pass count_fn=... to fit()")


def default_count_fn(model: nn.Module) -> CountFn:
    """Items per micro-batch for the default loss: scored label tokens for token-level labels, else rows."""
    shift = 1 if is_causal_lm(model) else 0

    def count(batch: Batch) -> int | torch.Tensor:
        labels = batch.get("labels") if isinstance(batch, Mapping) else None
        if isinstance(labels, torch.Tensor) and labels.dim() >= 2 and not labels.is_floating_point():
            return (labels[:, shift:] != IGNORE_INDEX).sum()
        return rows(batch)

    return count


def computed_tokens(batch: Batch) -> int:
    """Token positions the model computes, padding included (0 when the batch has no ``input_ids``)."""
    ids = batch.get("input_ids") if isinstance(batch, Mapping) else None
    return ids.numel() if isinstance(ids, torch.Tensor) else 0


def real_tokens(batch: Batch) -> int | torch.Tensor:
    """The examples' own input tokens, padding excluded (0 when unknown): from the mask, or counted at packing."""
    counted = getattr(batch, "real_tokens", None)
    if counted is not None:
        return int(counted)
    mask = batch.get("attention_mask") if isinstance(batch, Mapping) else None
    if not isinstance(mask, torch.Tensor):
        return 0
    # numpy, not a torch op (~5 us each)
    return int(mask.numpy().sum()) if mask.device.type == "cpu" else mask.sum()
