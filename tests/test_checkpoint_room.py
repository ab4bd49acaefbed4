"""Issue #30 item 9: a last/ checkpoint that cannot fit on the disk is found before the first step, not when the
run saves it hours later; a stop that would save it (time budget, SIGTERM) keeps best/ instead."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from kitlib import Callback, TrainConfig, fit
from kitlib.engine import checkpoint
from kitlib.errors import CheckpointError


class _Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(64, 64)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> Any:
        return type("Out", (), {"loss": torch.nn.functional.mse_loss(self.linear(x), labels)})()


def _loader() -> DataLoader[Any]:
    g = torch.Generator().manual_seed(0)
    rows = [{"x": torch.randn(64, generator=g), "labels": torch.randn(64, generator=g)} for _ in range(16)]
    return DataLoader(rows, batch_size=4)  # type: ignore[arg-type]


class _Steps(Callback):
    def __init__(self) -> None:
        self.steps = 0

    def on_step_end(self, step: Any) -> None:
        self.steps += 1


def test_a_last_checkpoint_that_cannot_fit_is_refused_before_the_first_step(tmp_path: Path, monkeypatch: Any) -> None:
    weights = 64 * 65 * 4  # bytes: last/ holds them and AdamW's two moments, twice while it is replaced
    monkeypatch.setattr(checkpoint, "free_bytes", lambda path: (2 * weights, tmp_path))
    steps = _Steps()
    cfg = TrainConfig(epochs=1, micro_batch_size=4, save_last=True, precision="fp32")
    with pytest.raises(CheckpointError, match=r"last/ \(weights and adamw state.*Fix: no last/"):
        fit(_Model(), _loader(), config=cfg, run_dir=tmp_path / "run", callbacks=[steps])
    assert steps.steps == 0
    # Without an explicit last/: the run trains, and its time-budget stop keeps best/ and writes no last/.
    cfg = TrainConfig(epochs=1, micro_batch_size=4, precision="fp32", time_budget_s=1e-3, save_best=True)
    result = fit(_Model(), _loader(), config=cfg, run_dir=tmp_path / "budget", callbacks=[steps])
    assert result.stop_reason == "time_budget" and not (tmp_path / "budget" / "last").exists()
