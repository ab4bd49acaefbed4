"""FLOPs per token, accelerator peaks, and model FLOPs utilisation (MFU).

    fpt = model_flops_per_token(model, seq_len=128)          # 6N + 12*L*T*d per trained token
    peak = peak_flops("Tesla T4", "fp16")                     # 65e12, from the datasheet
    print(f"MFU {mfu(tokens_per_s, fpt, peak):.1%}")

MFU = achieved model FLOP/s / peak FLOP/s (PaLM, Chowdhery et al. 2022, appendix B). Model FLOPs count only the
matmuls the model needs: recomputation (activation checkpointing) and padding are not credited, so padding and
recompute show up as *lower* MFU. On a CPU there is no datasheet number: ``measure_cpu_peak`` runs a short matmul
probe instead (call it once and keep the result; nothing here caches it).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Literal

import torch
from torch import nn

PeakDtype = Literal["fp32", "tf32", "fp16", "bf16"]

# Dense peak TFLOP/s per GPU and math mode, from NVIDIA's datasheets. The tensor-core figures there are often quoted
# "with sparsity" (2:4 structured sparsity, 2x); training is dense, so those are halved here. fp16/bf16 are tensor
# core rates with fp32 accumulate. A missing dtype means the card has no fast path for it (T4/V100 bf16 is emulated,
# TF32 needs sm80+, P100 has no tensor cores: its fp16 is 2x packed half math).
#   T4:   t4-tensor-core-datasheet-951643.pdf: FP32 8.1, mixed FP16/FP32 65
#   P100: tesla-p100-pcie-datasheet.pdf: PCIe FP32 9.3, FP16 18.7; SXM2 10.6, 21.2
#   V100: tesla-v100-datasheet-letter-fnl-web.pdf: PCIe FP32 14, tensor 112; SXM2 15.7, 125
#   A100: nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf: FP32 19.5, TF32 156, BF16/FP16 312 (PCIe = SXM peaks)
#   L4:   l4-gpu-datasheet: FP32 30.3, TF32 120*, BF16/FP16 242* (* sparsity -> 60, 121 dense)
#   H100: h100 datasheet (nvidia-tensor-core-gpu-datasheet): SXM FP32 67, TF32 989*, BF16/FP16 1979*;
#         PCIe FP32 51, TF32 756*, BF16/FP16 1513* (* sparsity -> halved)
PEAK_TFLOPS: Mapping[str, Mapping[PeakDtype, float]] = MappingProxyType(
    {
        "T4": MappingProxyType({"fp32": 8.1, "fp16": 65.0}),
        "P100-PCIE": MappingProxyType({"fp32": 9.3, "fp16": 18.7}),
        "P100-SXM2": MappingProxyType({"fp32": 10.6, "fp16": 21.2}),
        "V100-PCIE": MappingProxyType({"fp32": 14.0, "fp16": 112.0}),
        "V100-SXM2": MappingProxyType({"fp32": 15.7, "fp16": 125.0}),
        "A100": MappingProxyType({"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0}),
        "L4": MappingProxyType({"fp32": 30.3, "tf32": 60.0, "fp16": 121.0, "bf16": 121.0}),
        "H100-PCIE": MappingProxyType({"fp32": 51.0, "tf32": 378.0, "fp16": 756.5, "bf16": 756.5}),
        "H100-SXM": MappingProxyType({"fp32": 67.0, "tf32": 494.5, "fp16": 989.5, "bf16": 989.5}),
    }
)

# torch.cuda.get_device_name() spellings -> table keys. First match wins, so variants come before their family, and
# L4 is matched as a whole word ("NVIDIA L40S" is another card).
_NAME_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"H100.*PCIE", "H100-PCIE"),
    (r"H100", "H100-SXM"),
    (r"A100", "A100"),
    (r"V100.*PCIE", "V100-PCIE"),
    (r"V100", "V100-SXM2"),
    (r"P100.*SXM", "P100-SXM2"),
    (r"P100", "P100-PCIE"),
    (r"\bL4\b", "L4"),
    (r"\bT4\b", "T4"),
)


def gpu_key(device_name: str) -> str | None:
    """The PEAK_TFLOPS key for a device name such as 'Tesla T4' or 'NVIDIA A100-SXM4-40GB'; None if unknown."""
    upper = device_name.upper()
    return next((key for pattern, key in _NAME_PATTERNS if re.search(pattern, upper)), None)


def peak_flops(device_name: str, dtype: PeakDtype) -> float | None:
    """Dense datasheet peak in FLOP/s for this GPU and math mode; None for unknown cards or modes it lacks.

    >>> peak_flops("Tesla T4", "fp16")
    65000000000000.0
    """
    key = gpu_key(device_name)
    if key is None:
        return None
    tflops = PEAK_TFLOPS[key].get(dtype)
    return None if tflops is None else tflops * 1e12


def flops_per_token(n_params: int, n_layers: int, seq_len: int, d_model: int, *, training: bool = True) -> float:
    """Model FLOPs per token: 6N + 12*L*T*d for forward+backward, 2N + 4*L*T*d for forward only.

    N = non-embedding parameters (each is one multiply-add per token forward, two more backward); the attention term
    is QK^T and AV over a context of T tokens (PaLM appendix B, nanoGPT ``estimate_mfu``). Elementwise ops (norms,
    softmax, activations) are left out, as in both references: a few % for T << d.

    >>> flops_per_token(10_000_000, 6, 128, 384)
    63538944.0
    """
    forward = 2.0 * n_params + 4.0 * n_layers * seq_len * d_model
    return 3.0 * forward if training else forward


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
    """What FLOPs per token depend on, JSON-able for a run record: non-embedding params, layers, width.

    Layers and width come from a Hugging Face ``model.config`` (0 without one: no attention term).
    """
    config = getattr(model, "config", None)
    return {
        "model_non_embedding_params": non_embedding_params(model),
        "model_layers": _config_value(config, "num_hidden_layers", "n_layer", "num_layers") or 0,
        "model_width": _config_value(config, "hidden_size", "n_embd", "d_model") or 0,
    }


def model_flops_per_token(model: nn.Module, seq_len: int, *, training: bool = True) -> float:
    """flops_per_token for a Hugging Face model (layers and width from ``model.config``) or any nn.Module.

    A model without a config gets no attention term (exact for MLPs and CNN-free token models). Parameters that run
    once per sequence (a classifier head, BERT's pooler) are counted per token: ~1-2% high for MiniLM at T ~ 40.
    """
    facts = model_facts(model)
    return flops_per_token(
        facts["model_non_embedding_params"], facts["model_layers"], seq_len, facts["model_width"], training=training
    )


def mfu(tokens_per_s: float, flops_per_token: float, peak_flops: float) -> float:
    """Model FLOPs utilisation in [0, 1]: tokens/s x FLOPs per token / peak FLOP/s.

    Pass real (non-padding) tokens/s for the honest number; computed tokens/s gives the hardware's view.
    """
    if peak_flops <= 0:
        raise ValueError(f"peak_flops must be > 0, got {peak_flops}")
    return tokens_per_s * flops_per_token / peak_flops


def measure_cpu_peak(dtype: torch.dtype = torch.float32, seconds: float = 0.5, size: int = 1024) -> float:
    """Achievable matmul FLOP/s of this CPU with torch's current thread count: the best of repeated n^3 matmuls.

    Cost: ``seconds`` of full-core work plus one warm-up. 1024^2 fp32 operands (4 MiB each) leave the L2 cache, as
    a model's weights do; the best repeat filters out a noisy neighbour. Keep the result: it is not cached here.
    """
    a = torch.randn(size, size).to(dtype)
    b = torch.randn(size, size).to(dtype)
    torch.mm(a, b)  # warm-up: thread pool start, page faults on the output
    flop = 2.0 * size**3
    best = 0.0
    deadline = time.perf_counter() + seconds
    while True:
        start = time.perf_counter()
        torch.mm(a, b)
        elapsed = time.perf_counter() - start
        best = max(best, flop / elapsed)
        if start + elapsed >= deadline:
            return best


def _sdpa_cpu_formulas() -> dict[Any, Callable[..., int]]:
    """FLOP formulas for CPU scaled-dot-product attention, which torch's counter does not register (torch 2.13)."""
    from torch.utils import flop_counter

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
    """FLOPs torch's FlopCounterMode counts for one forward (+ backward when ``training``) pass over ``batch``.

    The cross-check for ``model_flops_per_token``: it counts the matmuls actually dispatched (padding included), so
    compare it with ``model_flops_per_token(model, T) * batch_rows * T`` for a batch padded to T. Gradients the pass
    leaves behind are cleared (set to None).
    """
    from torch.utils.flop_counter import FlopCounterMode

    from kitlib.objective import hf_loss

    loss_fn = loss_fn or hf_loss
    with FlopCounterMode(display=False, custom_mapping=_sdpa_cpu_formulas()) as counter:
        if training:
            loss_fn(model, batch).backward()
        else:
            with torch.no_grad():
                loss_fn(model, batch)
    model.zero_grad(set_to_none=True)
    return int(counter.get_total_flops())
