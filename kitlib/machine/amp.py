"""The precision plan at work: ``Precision`` (autocast + GradScaler, always called) and the fp32-master check."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

import torch

from kitlib.config import Dtype
from kitlib.errors import PrecisionError
from kitlib.machine.precision import PrecisionPlan

TORCH_DTYPES: dict[Dtype, torch.dtype] = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
_HALF_DTYPES: dict[torch.dtype, Dtype] = {torch.float16: "fp16", torch.bfloat16: "bf16"}


def check_master_weights(
    named_params: Iterable[tuple[str, torch.nn.Parameter]], *, keeps_bf16_updates: bool = False
) -> None:
    """A PrecisionError when a trainable weight is fp16/bf16, unless ``keeps_bf16_updates`` (Kahan summation)."""
    refused = set(_HALF_DTYPES) - ({torch.bfloat16} if keeps_bf16_updates else set())
    half = [(name, p.dtype) for name, p in named_params if p.requires_grad and p.dtype in refused]
    if not half:
        return
    dtypes = "/".join(sorted({_HALF_DTYPES[dtype] for _, dtype in half}))
    raise PrecisionError(
        f"{len(half)} trainable weight(s) are {dtypes} (e.g. {half[0][0]!r}): kitlib trains fp32 master weights "
        f"under fp16/bf16 autocast, and {dtypes} weights would not learn (updates below their resolution are lost; "
        "a GradScaler refuses fp16 gradients). Fix: model.float() before fit (autocast still computes in half "
        "precision), or, for bf16 weights, TrainConfig(optimizer='adamw-kahan'), which keeps the updates"
    )


class Precision:
    """autocast context + GradScaler (a no-op scaler unless fp16); for fp32, plain backward() and step()."""

    def __init__(self, plan: PrecisionPlan) -> None:
        self.plan = plan
        self._scaler = torch.amp.GradScaler(plan.device_type, enabled=plan.use_grad_scaler)

    def autocast(self) -> contextlib.AbstractContextManager[None]:
        """Context for the forward pass and loss; a null context for fp32."""
        if self.plan.dtype == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.plan.device_type, dtype=TORCH_DTYPES[self.plan.dtype])

    def backward(self, loss: torch.Tensor) -> None:
        self._scaler.scale(loss).backward()

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide the grads by the loss scale in place; call before clipping so the clip norm is in real units."""
        self._scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer, grads_finite: bool) -> bool:
        """A hand-written loop's optimizer step (1-2 host syncs); False if skipped for inf/nan grads. No zero_grad."""
        if not self._scaler.is_enabled():
            if grads_finite:
                optimizer.step()
            return grads_finite
        # get_scale() syncs, but scaler.step() already synced on found_inf: microseconds per step
        before = self._scaler.get_scale()
        self._scaler.step(optimizer)
        self._scaler.update()
        return self._scaler.get_scale() >= before

    def found_inf(self, norm: torch.Tensor) -> torch.Tensor:
        """1.0 where this step's gradients hold inf/nan, else 0.0, on the device (no sync); ``norm``: the clip norm."""
        return (~torch.isfinite(norm)).float()

    def apply(self, optimizer: torch.optim.Optimizer, found_inf: torch.Tensor) -> None:
        """The step, skipped on the device where ``found_inf`` is 1, then the scale update; call after ``unscale_``."""
        if getattr(optimizer, "_step_supports_amp_scaling", False):
            # GradScaler.step's protocol for these optimizers: the gradients are unscaled already (grad_scale None)
            optimizer.grad_scale, optimizer.found_inf = None, found_inf  # type: ignore[attr-defined]
            try:
                optimizer.step()
            finally:
                del optimizer.grad_scale, optimizer.found_inf  # type: ignore[attr-defined]
        elif not bool(found_inf):  # the one host sync: this optimizer cannot skip on the device
            optimizer.step()
        self._scaler.update()  # a no-op without a scaler

    def forget_unscale(self) -> None:
        """Forget an abandoned step's ``unscale_`` (an OOM replay), keeping the scale; one host sync, OOM path only."""
        if self._scaler.is_enabled():  # a disabled scaler keeps no per-optimizer record
            state = self._scaler.state_dict()
            self._scaler = torch.amp.GradScaler(self.plan.device_type)
            self._scaler.load_state_dict(state)

    @property
    def scale(self) -> float:
        """Current loss scale; 1.0 without a scaler."""
        return float(self._scaler.get_scale()) if self._scaler.is_enabled() else 1.0

    def state_dict(self) -> dict[str, Any]:
        return {"dtype": self.plan.dtype, "scaler": self._scaler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the loss scale; a checkpoint from another precision is fine (state ignored or fresh scaler)."""
        scaler_state = state.get("scaler") or {}
        if self._scaler.is_enabled() and scaler_state:
            self._scaler.load_state_dict(scaler_state)
