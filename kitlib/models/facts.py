"""Facts about a model's size that FLOPs per token depend on, JSON-able for a run's record."""

from __future__ import annotations

from typing import Any

from torch import nn


def _config_value(config: Any, *names: str) -> int | None:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return None


def non_embedding_params(model: nn.Module) -> int:
    """Parameters outside nn.Embedding tables (lookups, not matmuls); tied weights counted once."""
    embedding = {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
    return sum(p.numel() for p in model.parameters() if id(p) not in embedding)


def model_facts(model: nn.Module) -> dict[str, int]:
    """What FLOPs per token depend on, JSON-able: non-embedding params, layers and width (0 without a config)."""
    config = getattr(model, "config", None)
    return {
        "model_non_embedding_params": non_embedding_params(model),
        "model_layers": _config_value(config, "num_hidden_layers", "n_layer", "num_layers") or 0,
        "model_width": _config_value(config, "hidden_size", "n_embd", "d_model") or 0,
    }
