"""Precision: decide once from the hardware, then one small object the loop calls unconditionally.

>>> plan = decide_precision(fake_profile("2xT4"))
>>> plan.dtype, plan.use_grad_scaler
('fp16', True)
>>> precision = Precision(plan)
>>> with precision.autocast():
...     loss = model(x).loss
>>> precision.backward(loss)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any, get_args

import torch

from kitlib.config import Dtype, Requested
from kitlib.errors import PrecisionError, UnsupportedGPUError
from kitlib.machine.hardware import Accelerator, DeviceType, HardwareInfo, MathProbe, check_torch_supports

__all__ = [
    "Dtype",
    "Precision",
    "PrecisionError",
    "PrecisionPlan",
    "Requested",
    "UnsupportedGPUError",
    "check_master_weights",
    "decide_precision",
    "decide_stage_precision",
]

# bf16 autocast on a CPU must win by this much to be planned: it rounds every matmul's inputs to 8 bits of mantissa,
# and a 10% gain is about what a busy machine's noise can fake in a one-second probe.
BF16_MIN_SPEEDUP = 1.1
BF16_LOSS_AGREEMENT = 0.02  # relative: bf16's rounding moves a loss by ~0.1-0.5%; more means a broken kernel


_TORCH_DTYPES: dict[Dtype, torch.dtype] = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
_HALF_DTYPES: dict[torch.dtype, Dtype] = {torch.float16: "fp16", torch.bfloat16: "bf16"}


@dataclass(frozen=True)
class PrecisionPlan:
    dtype: Dtype
    device_type: DeviceType
    use_grad_scaler: bool  # fp16 only: its 5-bit exponent underflows small gradients without loss scaling
    tf32: bool  # allow TF32 matmul/cuDNN; CUDA sm80+ only (decide_precision checks the capability)
    reason: str  # one sentence, printed by 00_setup

    def __post_init__(self) -> None:
        if self.dtype not in get_args(Dtype):
            raise PrecisionError(f"dtype={self.dtype!r} is not one of {get_args(Dtype)}; pick one of those")
        if self.device_type not in get_args(DeviceType):
            raise PrecisionError(f"device_type={self.device_type!r} is not one of {get_args(DeviceType)}")
        if self.use_grad_scaler and self.dtype != "fp16":
            raise PrecisionError(
                f"a GradScaler only helps fp16; {self.dtype} has fp32's 8-bit exponent, so scaling only adds work "
                f"and an extra sync per step. Fix: use_grad_scaler=False"
            )
        if self.tf32 and self.device_type != "cuda":
            raise PrecisionError(
                f"tf32 is an NVIDIA Ampere+ (sm80+) tensor-core mode and does nothing on {self.device_type}. "
                f"Fix: tf32=False"
            )
        if not self.reason:
            raise PrecisionError("reason must say why this precision was chosen (it is printed for the user)")

    @property
    def torch_dtype(self) -> torch.dtype:
        return _TORCH_DTYPES[self.dtype]


def decide_precision(hw: HardwareInfo, requested: Requested = "auto", *, tf32: bool | None = None) -> PrecisionPlan:
    """The precision for this hardware: 'auto' picks the fastest safe one; explicit requests are checked.

    Raises PrecisionError (naming the fix) for impossible requests, and UnsupportedGPUError when torch has no
    kernels for the GPU at all (Kaggle's P100 with the current image).
    """
    if requested not in get_args(Requested):
        raise PrecisionError(f"precision={requested!r} is not valid. Fix: use one of {get_args(Requested)}")
    if hw.device_type == "cuda":
        return _decide_cuda(hw, requested, tf32)
    if tf32:
        raise PrecisionError(
            f"tf32=True needs an NVIDIA Ampere+ GPU (sm80+), but this run is on {hw.device_type}. "
            f"Fix: leave tf32=None (auto) or set tf32=False"
        )
    if hw.device_type == "mps":
        return _decide_mps(requested)
    return _decide_cpu(hw, requested)


def _decide_cuda(hw: HardwareInfo, requested: Requested, tf32: bool | None) -> PrecisionPlan:
    check_torch_supports(hw)
    gpus = [a for a in hw.accelerators if a.device_type == "cuda"]
    # DDP runs the same dtype on every rank, so the weakest card decides (mixed pairs are rare but exist locally).
    weakest: Accelerator = min(gpus, key=lambda a: a.capability)
    major, minor = weakest.capability
    card = f"{weakest.name} is sm{major}{minor}"
    if len(gpus) > 1:
        card = f"{card} (the weakest of {len(gpus)} GPUs decides)"
    ampere = weakest.capability >= (8, 0)
    if tf32 and not ampere:
        raise PrecisionError(
            f"tf32=True needs Ampere or newer (sm80+); {card} and has no TF32 tensor cores. "
            f"Fix: drop tf32=True (tf32=None turns it on automatically where it exists)"
        )
    use_tf32 = ampere if tf32 is None else tf32
    tf32_note = "; TF32 on for fp32 matmuls outside autocast" if use_tf32 else ""

    if requested == "bf16" and not ampere:
        # torch.cuda.is_bf16_supported() defaults to including_emulation=True and says True on a T4 (peers §3.6).
        raise PrecisionError(
            f"{card}: no bf16 tensor cores (torch reports bf16 'supported' only by slow emulation, and cuDNN has no "
            f"bf16 convolutions below sm80). Fix: use precision='fp16' or 'auto'"
        )
    if requested == "auto":
        if ampere:
            requested = "bf16"
            why = f"{card}: native bf16 tensor cores; bf16 autocast, no GradScaler (bf16 has fp32's range)"
        elif major == 7:
            requested = "fp16"
            why = (
                f"{card}: fp16 tensor cores, no native bf16 (torch reports bf16 'supported' by emulation); "
                f"fp16 autocast + GradScaler"
            )
        else:
            requested = "fp32"
            why = f"{card}: no tensor cores, so autocast saves little compute; fp32"
    else:
        why = f"{card}: {requested} as requested" + (" with GradScaler" if requested == "fp16" else "")
    return PrecisionPlan(requested, "cuda", requested == "fp16", use_tf32, why + tf32_note)


def _decide_mps(requested: Requested) -> PrecisionPlan:
    if requested == "auto":
        # Apple GPUs gain little compute from fp16, MPS autocast covers fewer ops than CUDA, and fp16 training needs
        # a GradScaler; fp32 is the safe default. fp16 is still worth asking for when activations do not fit.
        why = "Apple MPS: fp32 (fp16 gains little compute on Apple GPUs; request precision='fp16' to save memory)"
        return PrecisionPlan("fp32", "mps", False, False, why)
    if requested == "bf16":
        return PrecisionPlan("bf16", "mps", False, False, "Apple MPS: bf16 autocast as requested (needs macOS 14+)")
    if requested == "fp16":
        return PrecisionPlan("fp16", "mps", True, False, "Apple MPS: fp16 autocast + GradScaler as requested")
    return PrecisionPlan("fp32", "mps", False, False, "Apple MPS: fp32 as requested")


def _decide_cpu(hw: HardwareInfo, requested: Requested) -> PrecisionPlan:
    if requested == "auto":
        probe, native = hw.cpu_bf16_probe, hw.cpu_amx or hw.cpu_avx512_bf16
        isa = "AMX-BF16" if hw.cpu_amx else "AVX512-BF16"
        if probe is not None and native:  # measured: the ISA says bf16 can be fast, not that it is for this shape
            wins = probe.speedup >= BF16_MIN_SPEEDUP and probe.loss_gap <= BF16_LOSS_AGREEMENT
            verdict = "bf16 autocast, no GradScaler" if wins else _probe_loses(probe)
            return PrecisionPlan("bf16" if wins else "fp32", "cpu", False, False, f"CPU with {isa}: {probe.line()}; "
                                 f"{verdict}")  # fmt: skip
        if hw.cpu_amx:
            why = "CPU with AMX-BF16 tiles: bf16 autocast runs matmuls natively (not measured); no GradScaler"
            return PrecisionPlan("bf16", "cpu", False, False, why)
        why = (
            f"CPU with {isa}: fp32 (bf16 not measured here: kitlib.machine.speed.probe_cpu_bf16)"
            if native
            else "CPU without bf16 instructions (AMX-BF16/AVX512-BF16): bf16 would be emulated and slower (measured "
            "57x slower than fp32 on an AVX2 EPYC, 1.1-1.7x on an AVX512F Xeon); fp32"
        )
        return PrecisionPlan("fp32", "cpu", False, False, why)
    if requested == "bf16":
        if not (hw.cpu_amx or hw.cpu_avx512_bf16):
            raise PrecisionError(
                "this CPU has neither AMX-BF16 nor AVX512-BF16, so bf16 is emulated (57x slower than fp32 measured "
                "on an AVX2 EPYC). Fix: use precision='fp32' or 'auto'"
            )
        isa = "AMX-BF16" if hw.cpu_amx else "AVX512-BF16"
        return PrecisionPlan("bf16", "cpu", False, False, f"CPU with {isa}: bf16 autocast as requested")
    if requested == "fp16":
        if not (hw.cpu_amx_fp16 or hw.cpu_avx512_fp16):
            raise PrecisionError(
                "fp16 on this CPU (no AVX512-FP16/AMX-FP16) is emulated by converting to fp32 and back, slower than "
                "fp32. Fix: use precision='fp32' or 'auto' (auto picks bf16 on AMX CPUs)"
            )
        isa = "AMX-FP16" if hw.cpu_amx_fp16 else "AVX512-FP16"
        return PrecisionPlan("fp16", "cpu", True, False, f"CPU with {isa}: fp16 autocast + GradScaler as requested")
    return PrecisionPlan("fp32", "cpu", False, False, "CPU: fp32 as requested")


def _probe_loses(probe: MathProbe) -> str:
    if probe.loss_gap > BF16_LOSS_AGREEMENT:
        return f"fp32 (the losses disagree by more than {BF16_LOSS_AGREEMENT:.0%})"
    return f"fp32 (bf16 must be >= {BF16_MIN_SPEEDUP:g}x faster to be worth its rounding)"


def check_master_weights(
    named_params: Iterable[tuple[str, torch.nn.Parameter]], *, keeps_bf16_updates: bool = False
) -> None:
    """A PrecisionError naming the fix when a trainable weight is fp16/bf16: kitlib trains fp32 master weights and
    lets autocast compute in half precision. Trained as they are, fp16 weights stop the GradScaler ("Attempting to
    unscale FP16 gradients") and bf16 ones lose every AdamW update below bf16's resolution: no learning, silently.
    ``keeps_bf16_updates``: the optimizer keeps them (Kahan summation), so bf16 weights may train as they are."""
    refused = set(_HALF_DTYPES) - ({torch.bfloat16} if keeps_bf16_updates else set())
    half = [(name, p.dtype) for name, p in named_params if p.requires_grad and p.dtype in refused]
    if not half:
        return
    dtypes = "/".join(sorted({_HALF_DTYPES[dtype] for _, dtype in half}))
    raise PrecisionError(
        f"{len(half)} trainable weight(s) are {dtypes} (e.g. {half[0][0]!r}): kitlib trains fp32 master weights "
        f"under fp16/bf16 autocast, and {dtypes} weights would not learn (updates below their resolution are lost; "
        "a GradScaler refuses fp16 gradients). Fix: model.float() before fit (autocast still computes in half "
        "precision; kitlib's loaders do this for a half-precision checkpoint), or, for bf16 weights, "
        "TrainConfig(optimizer='adamw-kahan'): it keeps the updates (Kahan summation)"
    )


def decide_stage_precision(hw: HardwareInfo, requested: Requested) -> PrecisionPlan:
    """The precision for a stage that may run on another machine than the one 00 planned for: a Kaggle chain's 01
    on a CPU kernel while 02 trains on the T4 x2 (run.json's plan is 02's). The user's request where this machine
    can run it, else this machine's 'auto'."""
    try:
        return decide_precision(hw, requested)
    except UnsupportedGPUError:
        raise  # no precision helps: torch cannot run on this GPU at all
    except PrecisionError:
        plan = decide_precision(hw)
        return replace(plan, reason=f"{requested} is for the machine 00 planned for; here: {plan.reason}")


class Precision:
    """One small object: autocast context + GradScaler (a disabled no-op scaler when not fp16).

    The loop calls every method unconditionally; for fp32 they reduce to a plain backward() and step().
    """

    def __init__(self, plan: PrecisionPlan) -> None:
        self.plan = plan
        # torch.amp.GradScaler(device) works for cuda, cpu and mps; enabled=False makes every call a pass-through.
        self._scaler = torch.amp.GradScaler(plan.device_type, enabled=plan.use_grad_scaler)

    def autocast(self) -> contextlib.AbstractContextManager[None]:
        """Context for the forward pass and loss; a null context for fp32."""
        if self.plan.dtype == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.plan.device_type, dtype=self.plan.torch_dtype)

    def backward(self, loss: torch.Tensor) -> None:
        self._scaler.scale(loss).backward()

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide the grads by the loss scale in place; call before clipping so the clip norm is in real units."""
        self._scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer, grads_finite: bool) -> bool:
        """Apply the optimizer step; False if it was skipped for inf/nan grads. Does not zero_grad. Host-side, for a
        hand-written loop (one or two syncs a step); fit uses the sync-free ``found_inf`` + ``apply``.

        With a scaler the scaler decides (it checks the grads itself); without one, ``grads_finite`` (from the clip
        norm the loop computed) decides.
        """
        if not self._scaler.is_enabled():
            if not grads_finite:
                return False
            optimizer.step()
            return True
        # The scaler skips the step and halves the scale on inf/nan grads. get_scale() is a .item() (a CPU-GPU sync),
        # but scaler.step() has already synced on found_inf, so this costs microseconds per optimizer step.
        before = self._scaler.get_scale()
        self._scaler.step(optimizer)
        self._scaler.update()
        return self._scaler.get_scale() >= before

    def found_inf(self, norm: torch.Tensor) -> torch.Tensor:
        """1.0 where this step's gradients hold inf/nan (the step must be skipped), else 0.0; on the device, no host
        sync. ``norm``: the clip norm of the unscaled gradients, non-finite exactly when one of them is (the check
        GradScaler makes in ``unscale_``, read without its private per-optimizer state)."""
        return (~torch.isfinite(norm)).float()

    def apply(self, optimizer: torch.optim.Optimizer, found_inf: torch.Tensor) -> None:
        """The optimizer step, skipped on the device where ``found_inf`` is 1, then the loss scale's update (halved on
        inf/nan, on the device). No host sync with an optimizer that takes ``found_inf`` (fused Adam/AdamW, kitlib's
        default: its kernel skips the update and reverts its step count); any other needs one sync to decide on the
        host. Call after ``unscale_``. Does not zero_grad."""
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
        """Forget that ``unscale_`` ran in a step abandoned midway (an out-of-memory replay): the replay unscales its
        own gradients (GradScaler refuses a second unscale_ before update()). The loss scale and its growth count are
        kept: a fresh scaler loads the old one's state (public API; the unscale record itself is GradScaler's private
        state). One host sync (state_dict reads the scale), on the out-of-memory path only."""
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
        """Restore the loss scale. A checkpoint from another precision (T4 fp16 resumed on an A100 in bf16, or the
        reverse) is fine: the scaler state is ignored, or the scaler starts fresh (init scale 2**16)."""
        scaler_state = state.get("scaler") or {}
        if self._scaler.is_enabled() and scaler_state:
            self._scaler.load_state_dict(scaler_state)
