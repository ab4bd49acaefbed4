"""torch's FlopCounterMode count of a model's pass: the cross-check of kitlib.doctor.flops' estimate, used by
tests/test_flops.py and benchmarks/bench_doctor.py only (out of the wheel since issue #50)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode

from kitlib.engine.objective import hf_loss


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
