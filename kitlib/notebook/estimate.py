"""Rough times (+-2x) for a resolved run, per epoch and for 01-03, at an assumed speed (datasheet or per-core)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kitlib.config import full_eval_due
from kitlib.machine.peaks import compute_peak_flops
from kitlib.notebook.trees import MAX_ROWS as TREE_ROWS

if TYPE_CHECKING:
    from kitlib.machine.hardware import HardwareInfo
    from kitlib.notebook.presets import ResolvedRun

VALID_FRACTION = 0.1  # rows held out of train.csv for early stopping and the metric (stages splits by it)

# Non-embedding weights of all-MiniLM-L6-v2 (embedding lookups cost no matmul FLOPs)
MINILM_MATMUL_PARAMS = 10.6e6
# ~35 GFLOP/s per core measured on the 2-core CI box (docs/measurements.md); 30 leaves room for load
_CPU_FLOPS_PER_CORE = {"fp32": 30e9, "bf16": 120e9, "fp16": 60e9}  # bf16/fp16 only on AMX/AVX512 CPUs (assumed 4x/2x)
_GPU_UTILISATION = 0.3  # small encoders at 64-256 tokens are launch/memory-bound: ~20-40% of tensor peak (assumed)
_UNKNOWN_GPU_FLOPS = 10e12  # a GPU not in the table: assume T4-class
_MPS_FLOPS = 1.5e12  # Apple M-series GPU, fp32, achieved (assumed)
_DDP_EFFICIENCY = 0.9  # gradient all-reduce per step over PCIe (Kaggle's 2xT4 have no NVLink)
_PADDING_OVERHEAD = 1.1  # bucketed batches still pad ~10% (kitlib.data.lengths reports the real figure)
# What FLOPs leave out, measured on the demos (docs/measurements.md, "kitlib/notebook/estimate.py"):
_STAGE_START_S = 7.0  # a fresh kernel's imports, CSVs, model, hand-off and checkpoints per stage (one quiet Xeon core)
_TOKENIZE_ROWS_PER_S = 5_000.0  # fast tokenizers, per pass (01 makes three)
_STEP_OVERHEAD_S = 0.005  # Python, optimizer and loader work per optimizer step: a head's whole cost
_TREES_S = 6.0  # scikit-learn's import (~3 s) and a fit, in 02 per fold and in 03
# A Kaggle GPU session ends after 12 h; 02's default budget leaves 03's time and this margin inside it
KAGGLE_SESSION_S = 12 * 3600.0
BUDGET_MARGIN_S = 20 * 60.0
SMALL_ROWS = 5_000  # train.csv rows up to which the estimate offers folds: a 10% hold-out of <= 500 rows is noisy


def _device_flops(hw: HardwareInfo, dtype: str) -> tuple[float, str]:
    """Achieved FLOP/s of one process on ``hw`` in ``dtype`` (6N per trained token, 2N per forward), and why."""
    device = hw.primary
    if device is None:
        flops = _CPU_FLOPS_PER_CORE.get(dtype, _CPU_FLOPS_PER_CORE["fp32"]) * hw.cpu_count
        return flops, f"{flops / 1e9:.0f} GFLOP/s for {hw.cpu_count} CPU cores (not measured: a quiet machine)"
    if device.device_type == "mps":
        return _MPS_FLOPS, f"{_MPS_FLOPS / 1e12:.1f} TFLOP/s for an Apple GPU (not measured)"
    peak = compute_peak_flops(device.name, dtype)  # the one datasheet table (kitlib.machine.peaks)
    if peak is None:
        return _UNKNOWN_GPU_FLOPS, f"{_UNKNOWN_GPU_FLOPS / 1e12:.0f} TFLOP/s for an unknown GPU (T4-class)"
    return peak * _GPU_UTILISATION, f"{_GPU_UTILISATION:.0%} of the {device.name}'s {dtype} datasheet peak"


def _throughput(resolved: ResolvedRun, hw: HardwareInfo) -> float:
    """Achieved FLOP/s of the run's processes together."""
    world = resolved.world_size
    flops = _device_flops(hw, resolved.config.precision)[0]
    return flops * world * (_DDP_EFFICIENCY if world > 1 else 1.0)


def _tokens_per_row(resolved: ResolvedRun) -> float:
    """Mean tokens per row after truncation (half of max_length when no lengths were given), padding included."""
    max_length = resolved.config.max_length or resolved.preset.max_length_cap
    mean = resolved.mean_tokens if resolved.mean_tokens is not None else max_length / 2
    return mean * _PADDING_OVERHEAD


def estimate_epoch_seconds(
    resolved: ResolvedRun,
    n_rows: int,
    hw: HardwareInfo,
    *,
    model_params: float = MINILM_MATMUL_PARAMS,
) -> float:
    """Rough seconds per epoch (+-2x), rows capped at ``row_limit``: tokens x FLOPs/token."""
    if n_rows < 0:
        raise ValueError(f"n_rows must be >= 0, got {n_rows}")
    tokens = resolved.preset.rows_used(n_rows) * _tokens_per_row(resolved)
    flops_per_token = resolved.regime.matmuls_per_param * model_params
    return tokens * flops_per_token / _throughput(resolved, hw)


@dataclass(frozen=True)
class RunEstimate:
    """Seconds for each stage of a whole run (01-03), from the cost model; 00's own seconds are already spent."""

    features_s: float  # 01: tokenising train and test; the head regime's embedding pass over both
    train_s: float  # 02: every planned epoch (early stopping can only shorten it) and its evals
    infer_s: float  # 03: the test rows
    rows: int  # training rows used (the preset's row_limit applied)
    n_rows: int  # train.csv's rows
    n_test: int
    features_label: str  # what dominates 01: "tokenising" or "embedding pass"
    epoch_s: float  # 02's time per epoch
    assumed: str = ""  # the device speed it planned by: measured, or assumed for the device class
    folds: int = 1  # models trained (02) and predicting (03): k-fold's k

    @property
    def total_s(self) -> float:
        return self.features_s + self.train_s + self.infer_s

    @property
    def sessions(self) -> int:
        """Kaggle GPU sessions needed: each trains 12 h less 03's time and a margin; the last one predicts too."""
        per_session = max(1.0, KAGGLE_SESSION_S - self.infer_s - BUDGET_MARGIN_S)
        return max(1, math.ceil((self.features_s + self.train_s) / per_session))

    def text(self) -> str:
        rows = f"{self.rows} rows" if self.rows == self.n_rows else f"{self.rows} of {self.n_rows} rows (row limit)"
        parts = (
            f"01 {self.features_label} {duration(self.features_s)}, 02 training {duration(self.train_s)} "
            f"({duration(self.epoch_s)} per epoch), 03 predict {duration(self.infer_s)}"
        )
        assumed = f"; assumes {self.assumed}" if self.assumed else ""
        if self.folds > 1:
            parts += f"; {self.folds} folds: 02 and 03 x {self.folds}"
        elif self.n_rows <= SMALL_ROWS:  # few rows: one hold-out's verdict is noisy, k models affordable
            fold = self.features_s + 5 * (self.train_s + self.infer_s)
            parts += f"; small data: folds = 5 (00's parameters) validates every row, ~{duration(fold)} in all"
        if self.sessions > 1:  # 02 stops at its time budget; the next session, attached to this one's output, goes on
            parts += (f"; on Kaggle {self.sessions} GPU sessions of 12 h (time_budget; the next session: kaggle build "
                      "--continue-from)")  # fmt: skip
        return f"~{duration(self.total_s)} for the whole run: {parts}; {rows}, {self.n_test} test rows (rough{assumed})"


def estimate_run(
    resolved: ResolvedRun,
    n_rows: int,
    n_test: int,
    hw: HardwareInfo,
    *,
    model_params: float = MINILM_MATMUL_PARAMS,
    folds: int = 1,
    trees: bool = False,
) -> RunEstimate:
    """Rough seconds (+-2x) for 01, 02, 03 of ``resolved`` on ``hw``, x ``folds``; ``trees`` adds the blend's fits."""
    if n_rows < 0 or n_test < 0:
        raise ValueError(f"n_rows and n_test must be >= 0, got {n_rows} and {n_test}")
    cfg, regime = resolved.config, resolved.regime
    rows = resolved.preset.rows_used(n_rows)
    n_valid = max(1, round(VALID_FRACTION * rows)) if rows else 0
    n_train = rows - n_valid
    flops_per_row = 2 * model_params * _tokens_per_row(resolved)  # a forward pass; training costs 3x
    forward = flops_per_row / _throughput(resolved, hw)  # seconds per row
    steps = math.ceil(n_train / (cfg.micro_batch_size * resolved.world_size)) if n_train else 0
    tokenize, step_overhead, start = (rows * 2 + n_test) / _TOKENIZE_ROWS_PER_S, _STEP_OVERHEAD_S, _STAGE_START_S
    trees_s = _TREES_S if trees and regime.name == "head" and n_train <= TREE_ROWS else 0.0
    if regime.features_need_accelerator:  # 01 runs the encoder over every row, longest first: batches barely pad
        features = tokenize + (rows + n_test) * forward / _PADDING_OVERHEAD
        epoch, evals, infer = steps * step_overhead, 0.0, 0.0
    else:
        features = tokenize
        train_row = flops_per_row * regime.matmuls_per_param / 2 / _throughput(resolved, hw)
        epoch = n_train * train_row + steps * step_overhead
        batch = cfg.micro_batch_size * cfg.eval_batch_factor
        cheap = n_valid if cfg.eval_max_batches is None else min(n_valid, cfg.eval_max_batches * batch)
        evals = sum(
            (n_valid if full_eval_due(e, cfg.full_eval_every, cfg.full_eval_at_end, cfg.epochs) else cheap) * forward
            for e in range(1, cfg.epochs + 1)
        )
        infer = n_test * forward
    return RunEstimate(
        features_s=start + features,
        train_s=(start + cfg.epochs * epoch + evals + trees_s) * folds,
        infer_s=(start + infer) * folds + trees_s,
        rows=rows,
        n_rows=n_rows,
        n_test=n_test,
        features_label=regime.estimate_label if regime.features_need_accelerator else "tokenising",
        epoch_s=epoch,
        folds=folds,
        assumed=_device_flops(hw, cfg.precision)[1],
    )


def duration(seconds: float) -> str:
    """``seconds`` as a person reads a rough time: <1 s, 40 s, 12 min, 1.5 h."""
    if seconds < 1:
        return "<1 s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
