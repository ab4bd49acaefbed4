"""torch's FlopCounterMode count of a model's pass: the cross-check of kitlib.doctor.flops' estimate, and MFU
(used by tests/test_flops.py and benchmarks/ only: out of the wheel since issue #50)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode

from kitlib.doctor.flops import flops_per_token
from kitlib.engine.objective import hf_loss
from kitlib.models.facts import model_facts


def _sdpa_cpu_formulas() -> dict[Any, Callable[..., int]]:
    """FLOP formulas for CPU scaled-dot-product attention, which torch's counter does not register (torch 2.13)."""
    aten = torch.ops.aten
    forward_op = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    backward_op = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
    formulas: dict[Any, Callable[..., int]] = {}

    def forward(q: Any, k: Any, v: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
        return int(flop_counter.sdpa_flop_count(q, k, v))

    def backward(grad: Any, q: Any, k: Any, v: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
        return int(flop_counter.sdpa_backward_flop_count(grad, q, k, v))

    if forward_op is not None and forward_op not in flop_counter.flop_registry:
        formulas[forward_op] = forward
    if backward_op is not None and backward_op not in flop_counter.flop_registry:
        formulas[backward_op] = backward
    return formulas


def count_flops(
    model: nn.Module,
    batch: Any,
    *,
    loss_fn: Callable[[nn.Module, Any], torch.Tensor] | None = None,
    training: bool = True,
) -> int:
    """FLOPs torch's FlopCounterMode counts for one forward (+ backward when ``training``) pass over ``batch``
    (padding included); gradients it leaves are set to None."""
    loss_fn = loss_fn or hf_loss
    with FlopCounterMode(display=False, custom_mapping=_sdpa_cpu_formulas()) as counter:
        if training:
            loss_fn(model, batch).backward()
        else:
            with torch.no_grad():
                loss_fn(model, batch)
    model.zero_grad(set_to_none=True)
    return int(counter.get_total_flops())


def model_flops_per_token(model: nn.Module, seq_len: int, *, training: bool = True) -> float:
    """``flops_per_token`` for a Hugging Face model (layers, width from ``model.config``; no attention term without)."""
    facts = model_facts(model)
    return flops_per_token(
        facts["model_non_embedding_params"], facts["model_layers"], seq_len, facts["model_width"], training=training
    )


def mfu(tokens_per_s: float, flops_per_token: float, peak_flops: float) -> float:
    """Model FLOPs utilisation in [0, 1]: tokens/s x FLOPs per token / peak FLOP/s (pass real, unpadded tokens/s)."""
    if peak_flops <= 0:
        raise ValueError(f"peak_flops must be > 0, got {peak_flops}")
    return tokens_per_s * flops_per_token / peak_flops
