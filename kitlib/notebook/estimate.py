"""A rough time per epoch for a resolved run (expect +-2x): the planning number the picker and `presets --rows` show."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kitlib.machine.peaks import compute_peak_flops

if TYPE_CHECKING:
    from kitlib.machine.hardware import HardwareInfo
    from kitlib.notebook.presets import ResolvedRun

# Non-embedding weights of all-MiniLM-L6-v2: 6 layers x (4 x 384^2 attention + 2 x 384 x 1536 FFN) = 10.6M.
# Embedding lookups cost no matmul FLOPs, so they are left out.
MINILM_MATMUL_PARAMS = 10.6e6
# Measured on this project's 2-core AVX2 CI box: MiniLM-L6 fp32 fwd+bwd ~1,000-1,300 tokens/s and forward ~3,300
# tokens/s on 2 threads, i.e. ~35 GFLOP/s per core by the 6N/2N rule; 30 leaves room for a busy machine.
_CPU_FLOPS_PER_CORE = {"fp32": 30e9, "bf16": 120e9, "fp16": 60e9}  # bf16/fp16 only on AMX/AVX512 CPUs (assumed 4x/2x)
_GPU_UTILISATION = 0.3  # small encoders at 64-256 tokens are launch/memory-bound: ~20-40% of tensor peak (assumed)
_UNKNOWN_GPU_FLOPS = 10e12  # a GPU not in the table: assume T4-class
_MPS_FLOPS = 1.5e12  # Apple M-series GPU, fp32, achieved (assumed)
_DDP_EFFICIENCY = 0.9  # gradient all-reduce per step over PCIe (Kaggle's 2xT4 have no NVLink)
_PADDING_OVERHEAD = 1.1  # bucketed batches still pad ~10% (kitlib.data.lengths reports the real figure)


def _device_flops(hw: HardwareInfo, dtype: str) -> float:
    device = hw.primary
    if device is None:
        return _CPU_FLOPS_PER_CORE.get(dtype, _CPU_FLOPS_PER_CORE["fp32"]) * hw.cpu_count
    if device.device_type == "mps":
        return _MPS_FLOPS
    peak = compute_peak_flops(device.name, dtype)  # the one datasheet table (kitlib.machine.peaks)
    return _UNKNOWN_GPU_FLOPS if peak is None else peak * _GPU_UTILISATION


def estimate_epoch_seconds(
    resolved: ResolvedRun,
    n_rows: int,
    hw: HardwareInfo,
    *,
    samples_per_s: float | None = None,
    model_params: float = MINILM_MATMUL_PARAMS,
) -> float:
    """Rough seconds per epoch (expect +-2x): a planning number for the picker, not a promise.

    Rows are capped at the preset's ``row_limit``. With ``samples_per_s`` (measured, e.g. from ``fit``'s history, over
    all processes) it is ``n_rows / samples_per_s``.
    Otherwise: tokens per epoch = rows x mean tokens (truncated; half of max_length when unknown) x 1.1 padding;
    FLOPs = 6 x matmul params per token for fine-tuning (2 forward + 4 backward, Kaplan et al. 2020), 2 x for the head
    regime, whose cost is the one-time forward pass that caches embeddings (the head's own epochs take well under a
    second); throughput = an assumed achieved FLOP/s for the device class and dtype, x world size x 0.9 for DDP.
    """
    if n_rows < 0:
        raise ValueError(f"n_rows must be >= 0, got {n_rows}")
    if samples_per_s is not None:
        if samples_per_s <= 0:
            raise ValueError(f"samples_per_s must be > 0, got {samples_per_s}")
        return n_rows / samples_per_s
    n_rows = resolved.preset.rows_used(n_rows)
    cfg = resolved.config
    max_length = cfg.max_length or resolved.preset.max_length_cap
    tokens_per_row = resolved.mean_tokens if resolved.mean_tokens is not None else max_length / 2
    tokens = n_rows * tokens_per_row * _PADDING_OVERHEAD
    flops_per_token = resolved.regime.matmuls_per_param * model_params
    world = resolved.world_size
    throughput = _device_flops(hw, cfg.precision) * world * (_DDP_EFFICIENCY if world > 1 else 1.0)
    return tokens * flops_per_token / throughput
