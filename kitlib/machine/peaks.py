"""The one accelerator table: dense datasheet peaks per GPU and math mode, and the device-name matcher."""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Literal

PeakDtype = Literal["fp32", "tf32", "fp16", "bf16"]

# Dense datasheet TFLOP/s per GPU and math mode (sparsity halved, fp16/bf16 at fp32 accumulate)
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

# get_device_name() spellings -> keys; first match wins (variants first; L4 as a whole word, not L40S)
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
    """Dense datasheet peak FLOP/s for this GPU and math mode; None for unknown cards or modes.

    >>> peak_flops("Tesla T4", "fp16")
    65000000000000.0
    """
    key = gpu_key(device_name)
    tflops = PEAK_TFLOPS[key].get(dtype) if key is not None else None
    return None if tflops is None else tflops * 1e12


def compute_peak_flops(device_name: str, dtype: str) -> float | None:
    """The datasheet peak a run in ``dtype`` computes at (fp32 on TF32 cores where present; no fast path: fp32 rate)."""
    modes: tuple[PeakDtype, ...] = ("tf32", "fp32") if dtype == "fp32" else (dtype, "fp32")  # type: ignore[assignment]
    return next((peak for mode in modes if (peak := peak_flops(device_name, mode))), None)
