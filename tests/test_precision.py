from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from kitlib.machine.amp import Precision
from kitlib.machine.hardware import ARCH_LIST_WITH_SM60, fake_profile
from kitlib.machine.precision import (
    PrecisionError,
    PrecisionPlan,
    UnsupportedGPUError,
    decide_precision,
)
from kitlib.notebook import presets

# (profile, dtype, grad scaler, tf32, what the reason must name)
TABLE = [
    ("T4", "fp16", True, False, "Tesla T4"),
    ("2xT4", "fp16", True, False, "Tesla T4"),
    ("V100", "fp16", True, False, "V100"),
    ("A100", "bf16", False, True, "A100"),
    ("L4", "bf16", False, True, "L4"),
    ("H100", "bf16", False, True, "H100"),
    ("MPS", "fp32", False, False, "MPS"),
    ("CPU-AMX", "fp32", False, False, "CPU"),
    ("CPU", "fp32", False, False, "CPU"),
]


@pytest.mark.parametrize(("name", "dtype", "scaler", "tf32", "card"), TABLE)
def test_auto_decision_table(name: str, dtype: str, scaler: bool, tf32: bool, card: str) -> None:
    plan = decide_precision(fake_profile(name))
    assert (plan.dtype, plan.use_grad_scaler, plan.tf32) == (dtype, scaler, tf32)
    assert card in plan.reason
    assert plan.device_type == fake_profile(name).device_type


def test_reasons_say_why() -> None:
    assert "no native bf16" in decide_precision(fake_profile("T4")).reason
    assert "weakest of 2 GPUs" in decide_precision(fake_profile("2xT4")).reason
    assert "precision='bf16'" in decide_precision(fake_profile("CPU")).reason  # how to ask for it


def test_p100_without_sm60_kernels_refuses() -> None:
    with pytest.raises(UnsupportedGPUError, match=r"sm_60.*(T4|L4)"):
        decide_precision(fake_profile("P100"))
    with pytest.raises(PrecisionError):  # also for explicit fp32: the GPU itself cannot run
        decide_precision(fake_profile("P100"), "fp32")


def test_p100_with_sm60_kernels_is_fp32() -> None:
    plan = decide_precision(fake_profile("P100", torch_cuda_arch_list=ARCH_LIST_WITH_SM60))
    assert (plan.dtype, plan.use_grad_scaler, plan.tf32) == ("fp32", False, False)
    assert "P100" in plan.reason


@pytest.mark.parametrize(
    ("name", "requested", "tf32", "fix"),
    [
        ("T4", "bf16", None, "precision='fp16' or 'auto'"),
        ("2xT4", "bf16", None, "precision='fp16' or 'auto'"),
        ("V100", "bf16", None, "precision='fp16'"),
        ("CPU", "fp16", None, "precision='fp32' or 'auto'"),
        ("CPU", "bf16", None, "precision='fp32' or 'auto'"),
        ("V100", "auto", True, "tf32"),
        ("T4", "fp32", True, "tf32"),
        ("CPU", "auto", True, "tf32=False"),
        ("CPU-AMX", "bf16", True, "tf32=False"),
        ("MPS", "auto", True, "tf32=False"),
    ],
)
def test_impossible_requests_name_the_fix(name: str, requested: str, tf32: bool | None, fix: str) -> None:
    with pytest.raises(PrecisionError, match="Fix:") as err:
        decide_precision(fake_profile(name), requested, tf32=tf32)  # type: ignore[arg-type]
    assert fix in str(err.value)


def test_bad_request_string() -> None:
    with pytest.raises(PrecisionError, match="not valid"):
        decide_precision(fake_profile("T4"), "int8")  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["T4", "2xT4", "V100", "A100", "L4", "H100", "MPS", "CPU-AMX", "CPU"])
def test_explicit_fp32_always_allowed(name: str) -> None:
    plan = decide_precision(fake_profile(name), "fp32")
    assert plan.dtype == "fp32" and not plan.use_grad_scaler


def test_possible_overrides() -> None:
    a100 = fake_profile("A100")
    assert decide_precision(a100, "fp16").use_grad_scaler
    assert decide_precision(a100, "fp32").tf32  # auto TF32 still speeds up fp32 matmuls on sm80+
    assert not decide_precision(a100, tf32=False).tf32
    assert decide_precision(fake_profile("T4"), tf32=False).dtype == "fp16"
    assert decide_precision(fake_profile("CPU-AMX"), "fp16").use_grad_scaler  # AVX512-FP16 is native
    assert decide_precision(fake_profile("MPS"), "fp16").use_grad_scaler
    assert decide_precision(fake_profile("P100", torch_cuda_arch_list=ARCH_LIST_WITH_SM60), "fp16").use_grad_scaler


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"dtype": "bf16", "device_type": "cuda", "use_grad_scaler": True}, "use_grad_scaler=False"),
        ({"dtype": "fp32", "device_type": "cuda", "use_grad_scaler": True}, "use_grad_scaler=False"),
        ({"dtype": "fp32", "device_type": "cpu", "tf32": True}, "tf32=False"),
        ({"dtype": "bf16", "device_type": "mps", "tf32": True}, "tf32=False"),
        ({"dtype": "fp8", "device_type": "cuda"}, "dtype"),
        ({"dtype": "fp32", "device_type": "tpu"}, "device_type"),
        ({"dtype": "fp32", "device_type": "cpu", "reason": ""}, "reason"),
    ],
)
def test_plan_validates_at_construction(kwargs: dict[str, object], match: str) -> None:
    full: dict[str, object] = {"use_grad_scaler": False, "tf32": False, "reason": "test", **kwargs}
    with pytest.raises(PrecisionError, match=match):
        PrecisionPlan(**full)  # type: ignore[arg-type]


def _plan(dtype: str, scaler: bool = False) -> PrecisionPlan:
    return PrecisionPlan(dtype, "cpu", scaler, False, "test")  # type: ignore[arg-type]


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 1))


def test_fp32_precision_is_bit_identical_to_plain_loop() -> None:
    x, y = torch.randn(32, 8, generator=torch.Generator().manual_seed(1)), torch.randn(32, 1)
    plain, wrapped = _model(), _model()
    opt_a = torch.optim.AdamW(plain.parameters(), lr=1e-2)
    opt_b = torch.optim.AdamW(wrapped.parameters(), lr=1e-2)
    precision = Precision(_plan("fp32"))
    for _ in range(3):
        loss = nn.functional.mse_loss(plain(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(plain.parameters(), 1.0)
        opt_a.step()
        opt_a.zero_grad()

        with precision.autocast():
            loss = nn.functional.mse_loss(wrapped(x), y)
        precision.backward(loss)
        precision.unscale_(opt_b)
        norm = torch.nn.utils.clip_grad_norm_(wrapped.parameters(), 1.0)
        assert precision.step(opt_b, grads_finite=bool(torch.isfinite(norm)))
        opt_b.zero_grad()
    for a, b in zip(plain.parameters(), wrapped.parameters(), strict=True):
        assert torch.equal(a, b)
    assert precision.scale == 1.0


def test_bf16_precision_autocasts_on_cpu() -> None:
    model, precision = _model(), Precision(_plan("bf16"))
    with precision.autocast():
        out = model(torch.randn(4, 8))
    assert out.dtype == torch.bfloat16
    assert model(torch.randn(4, 8)).dtype == torch.float32  # nothing leaks outside the context


def _poison(model: nn.Module) -> None:
    first = next(model.parameters())
    assert first.grad is not None
    first.grad[0, 0] = float("inf")


def test_step_without_scaler_skips_nonfinite() -> None:
    model, precision = _model(), Precision(_plan("fp32"))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    precision.backward(model(torch.randn(4, 8)).sum())
    _poison(model)
    assert precision.step(opt, grads_finite=False) is False
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_step_with_scaler_skips_nonfinite_and_backs_off() -> None:
    model, precision = _model(), Precision(_plan("fp16", scaler=True))  # GradScaler("cpu") stands in for cuda
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    scale = precision.scale
    with precision.autocast():
        loss = model(torch.randn(4, 8)).float().sum()
    precision.backward(loss)
    _poison(model)
    precision.unscale_(opt)
    assert precision.step(opt, grads_finite=True) is False  # the scaler's own inf check decides
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert precision.scale == scale / 2
    opt.zero_grad()

    with precision.autocast():  # small loss: at scale 2**15 a larger one genuinely overflows fp16 (and is skipped)
        loss = model(torch.randn(4, 8)).float().mean() * 1e-3
    precision.backward(loss)
    assert precision.step(opt, grads_finite=True) is True
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_state_dict_round_trip() -> None:
    model, precision = _model(), Precision(_plan("fp16", scaler=True))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    precision.backward(model(torch.randn(4, 8)).sum())
    _poison(model)
    precision.step(opt, grads_finite=True)
    state = precision.state_dict()

    restored = Precision(_plan("fp16", scaler=True))
    restored.load_state_dict(state)
    assert restored.scale == precision.scale == 2.0**15
    assert restored.state_dict()["scaler"] == state["scaler"]

    # Changing precision between runs (T4 fp16 -> A100 bf16 and back) must not fail.
    plain = Precision(_plan("fp32"))
    plain.load_state_dict(state)
    assert plain.scale == 1.0
    fresh = Precision(_plan("fp16", scaler=True))
    fresh.load_state_dict(plain.state_dict())
    assert fresh.scale == 2.0**16


# ------------------------------------------------------------------------ a CPU's precision: fp32 unless asked
@pytest.mark.parametrize("name", ["CPU-AMX", "CPU"])
def test_a_cpu_trains_fp32_unless_bf16_is_asked_and_its_isa_has_bf16(name: str) -> None:
    """#50 (list B1): no bf16 probe decides a CPU's precision: auto is fp32 on every CPU, AMX included, and the
    reason names the parameter that asks for bf16; asked for, bf16 runs where the ISA has it, else the error's fix."""
    cpu = fake_profile(name)
    auto = decide_precision(cpu)
    assert auto.dtype == "fp32" and "precision='bf16'" in auto.reason
    assert presets.resolve("balanced", cpu, lengths=[30] * 500).config.precision == "fp32"
    if cpu.cpu_amx:
        assert decide_precision(cpu, "bf16").dtype == "bf16"
        assert decide_precision(dataclasses.replace(fake_profile("CPU"), cpu_avx512_bf16=True), "bf16").dtype == "bf16"
    else:
        with pytest.raises(PrecisionError, match="emulated"):
            decide_precision(cpu, "bf16")
