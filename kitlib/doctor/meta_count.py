"""The memory plan's parameter counts (kitlib.doctor.memory_plan.model_shape), taken from the model transformers builds
on the meta device from its config: no weights are allocated or read. The plan imports this module only when it counts.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoModelForSequenceClassification
from transformers.pytorch_utils import Conv1D

from kitlib.engine.optim import freeze


def parameter_counts(config: Any, model_kind: str) -> tuple[int, int, int, int, int]:
    """(all weights, the embeddings', the linear layers', their in + out features summed, the output layer's) of
    ``config`` built as ``model_kind`` on the meta device."""
    with torch.device("meta"):
        model = meta_model(config, model_kind)
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    head_params = int(head.weight.numel()) if head is not None else _classifier_params(model)
    linear, dims = _linear_layers(model, exclude=head)
    return sum(p.numel() for p in model.parameters()), int(freeze(model, "embeddings")), linear, dims, head_params


def meta_model(config: Any, model_kind: str) -> nn.Module:
    """``config``'s transformers model for ``model_kind``, built on the current device: the meta device when counting,
    the CPU in the memory plan's live check (benchmarks/live_bytes.py)."""
    auto = {"decoder": AutoModelForCausalLM, "encoder-decoder": AutoModelForSeq2SeqLM}
    return auto.get(model_kind, AutoModelForSequenceClassification).from_config(config)


def _linear_layers(model: nn.Module, *, exclude: nn.Module | None) -> tuple[int, int]:
    """(weights, in + out features summed) of the nn.Linear and GPT-2 Conv1D layers, the output layer left out."""
    layers = [m.weight for m in model.modules() if m is not exclude and isinstance(m, nn.Linear | Conv1D)]
    return sum(w.numel() for w in layers), sum(sum(w.shape) for w in layers)


def _classifier_params(model: nn.Module) -> int:
    found = [m for name, m in model.named_children() if name in ("classifier", "score", "qa_outputs")]
    return sum(p.numel() for m in found for p in m.parameters())
