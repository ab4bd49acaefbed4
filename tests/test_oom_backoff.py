"""Out-of-memory back-off: a step that runs out of memory is replayed at half the micro-batch and twice the
accumulation, and the run equals one started there (CPU, fp32, bit for bit: the same micro-batches in the same
order, so the same floating-point sums; the injected error strikes after a forward, mid-window)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from kitlib import Callback, TrainConfig, fit
from kitlib.engine.backoff import next_strategy, split_batch
from kitlib.errors import DoesNotFitError

sys.path.insert(0, str(Path(__file__).parent))
import _jobs


class OomAbove(nn.Module):
    """``inner``, whose forward raises CUDA's out-of-memory error after it ran (dropout drew, activations exist)
    on a batch of more than ``limit`` rows, from call ``after + 1`` on: the window's first micro-batch fits and
    leaves its gradients behind, the second fails."""

    def __init__(self, inner: nn.Module, limit: int, after: int = 0) -> None:
        super().__init__()
        self.inner, self.limit, self.after, self.calls, self.biggest = inner, limit, after, 0, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.inner(x)
        self.calls += 1
        self.biggest = max(self.biggest, x.shape[0])
        if x.shape[0] > self.limit and self.calls > self.after:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected by the test)")
        return out


def mse(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return nn.functional.mse_loss(model(batch[0]), batch[1])


def _cfg(**kw: Any) -> TrainConfig:
    base = dict(epochs=2, lr=1e-2, precision="fp32", save_best=False, seed=3, warmup_ratio=0.2)
    return TrainConfig(**{**base, **kw})


def _run(model: nn.Module, batch: int, accum: int, cpu_hw: Any, run_dir: Path | None = None, **kw: Any) -> Any:
    loader = DataLoader(_jobs.data(64), batch_size=batch, shuffle=True)  # dropout + shuffling: RNG and order matter
    cfg = _cfg(micro_batch_size=batch, grad_accum_steps=accum, **kw.pop("cfg", {}))
    return fit(model, loader, config=cfg, loss_fn=mse, hw=cpu_hw, run_dir=run_dir, **kw)


def test_backoff_ends_with_the_weights_of_a_run_started_at_half_the_micro_batch(
    tmp_path: Path, cpu_hw: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    expected = _run(_jobs.model(), 4, 4, cpu_hw).model.state_dict()
    capsys.readouterr()
    wrapped = OomAbove(_jobs.model(), limit=4, after=1)
    result = _run(wrapped, 8, 2, cpu_hw, run_dir=tmp_path)
    for name, tensor in expected.items():
        assert torch.equal(tensor, wrapped.inner.state_dict()[name]), f"{name} differs from the 4 x 4 run"
    assert result.steps == 8 and wrapped.calls == 2 + 32  # the failed attempt, then 4 steps x 4 pieces x 2 epochs
    said = capsys.readouterr().out
    assert "out of memory at step 1: replaying it at micro-batch 4 x accumulation 4 (was 8 x 2" in said
    run = json.loads((tmp_path / "timing.json").read_text())["run"]
    assert run["micro_batch_size"] == 4 and run["grad_accum_steps"] == 4
    [change] = run["oom_backoffs"]
    assert change["step"] == 1 and change["micro_batch"] == [8, 4] and change["grad_accum_steps"] == [2, 4]
    assert "injected by the test" in change["error"]


class CrashAt(Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_fit_start(self, loop: Any) -> None:
        self.loop = loop

    def on_step_end(self, step: Any) -> None:  # after kitlib's policies: the save of this step is queued
        if self.loop.state.step == self.step:
            raise KeyboardInterrupt("the session ended")


def test_resume_after_a_backoff_goes_on_at_the_smaller_micro_batch(tmp_path: Path, cpu_hw: Any) -> None:
    expected = _run(_jobs.model(), 4, 4, cpu_hw).model.state_dict()
    save = {"cfg": {"save_last": True, "save_every_steps": 2}}
    with pytest.raises(KeyboardInterrupt):
        _run(OomAbove(_jobs.model(), limit=4, after=1), 8, 2, cpu_hw, tmp_path, callbacks=[CrashAt(3)], **save)
    # The resumed process's model would fail at once at 8 rows: the checkpoint must hold the micro-batch that fitted.
    resumed = OomAbove(_jobs.model(), limit=4)
    result = _run(resumed, 8, 2, cpu_hw, tmp_path, resume=True, **save)
    assert resumed.biggest == 4, "the resumed run tried the micro-batch that had run out of memory"
    for name, tensor in expected.items():
        assert torch.equal(tensor, result.model.inner.state_dict()[name]), f"{name} differs after resume"
    run = json.loads((tmp_path / "timing.json").read_text())["run"]
    assert [c["step"] for c in run["oom_backoffs"]] == [1]  # the first run's back-off, carried, none new


def test_out_of_memory_at_micro_batch_one_names_the_plans_next_strategy(cpu_hw: Any) -> None:
    with pytest.raises(DoesNotFitError, match=r"micro-batch 1 x accumulation 4: nothing left to halve .*gradient_ch"):
        _run(OomAbove(_jobs.model(), limit=0), 2, 2, cpu_hw)
    with pytest.raises(DoesNotFitError, match=r"next strategy: frozen embeddings"):
        cfg = {"gradient_checkpointing": True, "checkpoint_modules": ("inner.0",)}
        _run(OomAbove(_jobs.model(), limit=0), 2, 2, cpu_hw, cfg=cfg)
    both = TrainConfig(gradient_checkpointing=True, freeze="embeddings")
    assert "8-bit AdamW (optimizer = 'adamw8bit' in 00's parameters" in next_strategy(both)
    assert "gradient_checkpointing = True in 00's parameters" in next_strategy(TrainConfig())  # a notebook's reach


def test_split_batch_cuts_rows_and_keeps_the_rest() -> None:
    batch = {"input_ids": torch.arange(10).view(5, 2), "texts": list("abcde"), "scale": torch.tensor(2.0)}
    pieces = split_batch(batch, 2)
    assert [p["input_ids"].shape[0] for p in pieces] == [3, 2] and pieces[1]["texts"] == ["d", "e"]
    assert all(p["scale"] is batch["scale"] for p in pieces)
    x, y = torch.randn(3, 4), torch.randn(3, 1)
    assert [tuple(t.shape[0] for t in p) for p in split_batch((x, y), 4)] == [(1, 1)] * 3  # never an empty piece


def test_a_replayed_step_may_unscale_again_under_a_grad_scaler() -> None:
    """fp16 on a T4: an out-of-memory error in the optimizer phase (its state's first allocation) comes after
    unscale_; the replay unscales its own gradients, which GradScaler refuses unless the back-off made it forget."""
    from kitlib.machine.amp import Precision
    from kitlib.machine.precision import PrecisionPlan

    precision = Precision(PrecisionPlan("fp16", "cpu", True, False, "a GradScaler, on the CPU for the test"))
    model = nn.Linear(4, 1)
    optimizer = torch.optim.AdamW(model.parameters())
    precision.backward(model(torch.randn(2, 4)).sum())
    precision.unscale_(optimizer)
    with pytest.raises(RuntimeError, match=r"unscale_\(\) has already been called"):
        precision.unscale_(optimizer)
    precision.forget_unscale()
    optimizer.zero_grad()
    precision.backward(model(torch.randn(2, 4)).sum())
    precision.unscale_(optimizer)  # the replay's own unscale
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
