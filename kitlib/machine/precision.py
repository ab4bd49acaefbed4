"""Precision decided once from the hardware, without torch; the object the loop calls is amp's ``Precision(plan)``."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import get_args

from kitlib.config import Dtype, Requested, TrainConfig
from kitlib.errors import PrecisionError, UnsupportedGPUError
from kitlib.machine.hardware import Accelerator, DeviceType, HardwareInfo, check_torch_supports


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


def decide_precision(hw: HardwareInfo, requested: Requested = "auto", *, tf32: bool | None = None) -> PrecisionPlan:
    """The precision for this hardware: 'auto' picks the fastest safe one; explicit requests are checked (PrecisionError
    naming the fix; UnsupportedGPUError where torch has no kernels for the GPU)."""
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


# a half dtype on the CPU: (HardwareInfo flag, ISA name) that run it natively, GradScaler, why not elsewhere
_CPU_HALF: dict[str, tuple[tuple[tuple[str, str], ...], bool, str]] = {
    "bf16": ((("cpu_amx", "AMX-BF16"), ("cpu_avx512_bf16", "AVX512-BF16")), False,
             "this CPU has neither AMX-BF16 nor AVX512-BF16, so bf16 is emulated (57x slower than fp32 measured on an "
             "AVX2 EPYC)"),
    "fp16": ((("cpu_amx_fp16", "AMX-FP16"), ("cpu_avx512_fp16", "AVX512-FP16")), True,
             "fp16 on this CPU (no AVX512-FP16/AMX-FP16) is emulated by converting to fp32 and back, slower than fp32"),
}  # fmt: skip


def _decide_cpu(hw: HardwareInfo, requested: Requested) -> PrecisionPlan:
    if requested == "auto":
        # bf16's gain on a CPU depends on the model (one AMX core: MiniLM 1.8x, a BiLSTM 0.92x): asked for, not guessed
        why = "CPU: fp32 (precision='bf16' runs bf16 autocast on a CPU with AMX-BF16 or AVX512-BF16)"
        return PrecisionPlan("fp32", "cpu", False, False, why)
    if requested in _CPU_HALF:
        isas, scaler, emulated = _CPU_HALF[requested]
        isa = next((name for flag, name in isas if getattr(hw, flag)), None)
        if isa is None:
            raise PrecisionError(f"{emulated}. Fix: use precision='fp32' or 'auto'")
        how = "fp16 autocast + GradScaler" if scaler else "bf16 autocast"
        return PrecisionPlan(requested, "cpu", scaler, False, f"CPU with {isa}: {how} as requested")
    return PrecisionPlan("fp32", "cpu", False, False, "CPU: fp32 as requested")


def carried(cfg: TrainConfig, hw: HardwareInfo) -> PrecisionPlan:
    """The precision the run's resolution decided (``cfg.precision``, ``cfg.tf32``) as a plan on ``hw``'s device:
    fit, 02's batching probe and 03 read it, deciding nothing again (PrecisionError where ``hw`` cannot run it)."""
    return decide_precision(hw, cfg.precision, tf32=cfg.tf32)


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
