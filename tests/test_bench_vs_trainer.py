"""benchmarks/bench_vs_trainer.py's contenders run the precision they would run for a user on this machine."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_vs_trainer", ROOT / "benchmarks" / "bench_vs_trainer.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # ~20 s: imports transformers and accelerate
def test_the_tuned_trainer_runs_a_cpu_plan_on_the_cpu(tmp_path: Path) -> None:
    """On a CPU that plans bf16 (AMX, or a probe that measured it faster), the tuned Trainer's arguments are valid:
    TrainingArguments refuses bf16=True without use_cpu=True on a machine without a bf16 GPU (the crash on AMX)."""
    pytest.importorskip("accelerate")
    from transformers import TrainingArguments

    bench = _bench()
    for dtype in ("bf16", "fp32"):
        args = TrainingArguments(output_dir=str(tmp_path), report_to="none", **bench.tuned_settings(dtype, cuda=False))
        assert args.use_cpu and args.bf16 == (dtype == "bf16") and not args.fp16
    assert not bench.tuned_settings("fp16", cuda=True)["use_cpu"]  # a GPU keeps Trainer's device
