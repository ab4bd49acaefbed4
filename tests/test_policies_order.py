"""Callbacks run in their declared order; kitlib's policies can be removed or replaced; the facts policies share
(best, evals since best, skipped steps) are the loop's, so no policy needs another one in the list, in any order."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pytest
import torch
from test_fit_policies import InfOnCalls, _cfg, _data, _mse  # the same toy regression
from torch import nn
from torch.utils.data import DataLoader

from kitlib import TrainConfig, fit
from kitlib.engine.evaluation import SplitEval
from kitlib.engine.events import Callback, StepEnd
from kitlib.engine.loop import FitResult
from kitlib.engine.policies import EarlyStopping, NonFiniteGuard, ProgressLog, default_policies
from kitlib.errors import NonFiniteLossError

# A full eval whose score is a fixed function of the epoch: best at epoch 2, no improvement after it.
SCORES = {1: 0.5, 2: 0.7, 3: 0.6, 4: 0.65, 5: 0.9, 6: 0.9}


def _scored(**kw: Any) -> TrainConfig:
    return _cfg(**{"epochs": 6, "full_eval_every": 1, "monitor": "score", "mode": "max", **kw})


def _counting_eval() -> Any:
    calls: list[int] = []

    def full_eval(model: nn.Module) -> dict[str, float]:
        calls.append(1)
        return {"score": SCORES[len(calls)]}

    return full_eval


def _fit(cfg: TrainConfig, **kw: Any) -> FitResult:
    torch.manual_seed(0)
    return fit(nn.Linear(4, 1), DataLoader(_data(), batch_size=8), config=cfg, loss_fn=_mse, **kw)


class Named(Callback):
    def __init__(self, name: str, order: int, seen: list[str]) -> None:
        self.name, self.order, self.seen = name, order, seen

    def on_epoch_end(self, record: Mapping[str, Any]) -> None:
        self.seen.append(self.name)


class Nan(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) * math.nan


def test_a_callback_runs_where_its_declared_order_says_whatever_its_list_position(cpu_hw) -> None:
    seen: list[str] = []
    late, plain, early = Named("late", 5, seen), Named("plain", 0, seen), Named("early", -5, seen)
    _fit(_cfg(epochs=1), hw=cpu_hw, callbacks=[late, plain, early])
    assert seen == ["early", "plain", "late"]

    class Steps(Callback):
        def __init__(self, order: int) -> None:
            self.order, self.steps = order, 0

        def on_step_end(self, step: StepEnd) -> None:
            self.steps += 1

    # order -1000, last in the list: before kitlib's non-finite guard, which raises in the first step's on_step_end
    before, after = Steps(-1000), Steps(0)
    with pytest.raises(NonFiniteLossError):
        fit(Nan(), DataLoader(_data(), batch_size=8), config=_cfg(max_nonfinite_steps=1), loss_fn=_mse, hw=cpu_hw,
            callbacks=[after, before])  # fmt: skip
    assert (before.steps, after.steps) == (1, 0)


def test_a_default_policy_removed_and_one_replaced(cpu_hw, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _scored(patience=5)
    default = _fit(cfg, hw=cpu_hw, full_eval=_counting_eval())
    assert default.stop_reason == "completed" and "train:" in capsys.readouterr().out  # patience 5: never stops
    chosen = [
        EarlyStopping(1) if isinstance(p, EarlyStopping) else p
        for p in default_policies(cfg)
        if not isinstance(p, ProgressLog)
    ]
    custom = _fit(cfg, hw=cpu_hw, full_eval=_counting_eval(), policies=chosen)
    assert "train:" not in capsys.readouterr().out  # no progress bar
    # patience 1: epoch 3 did not beat epoch 2, so the run stops at epoch 3's boundary
    assert custom.stop_reason == "early_stopping" and custom.history["epoch"].tolist() == [1, 2, 3]
    assert (custom.best_epoch, custom.best_metric) == (2, 0.7)


@pytest.mark.parametrize("background", [False, True], ids=["foreground", "background"])
def test_policies_that_share_a_fact_work_without_each_other_and_in_either_order(cpu_hw, tmp_path, background) -> None:
    """Best, best epoch and evaluations since the best are the loop's: early stopping needs no best-checkpoint
    policy, and reversing kitlib's list changes nothing (the declared orders decide), with the verdicts arriving
    at the epoch's end or one epoch later from a background eval."""
    cfg = _scored(patience=1, background_eval="thread" if background else "off")

    def full_eval() -> Any:
        plain = _counting_eval()
        return SplitEval(plain, lambda metrics: metrics) if background else plain

    expected = _fit(cfg, hw=cpu_hw, full_eval=full_eval(), run_dir=tmp_path / "a")
    alone = _fit(cfg, hw=cpu_hw, full_eval=full_eval(), policies=[EarlyStopping(1)])
    reverse = _fit(cfg, hw=cpu_hw, full_eval=full_eval(), run_dir=tmp_path / "b",
                   policies=default_policies(cfg)[::-1])  # fmt: skip
    assert expected.stop_reason == "early_stopping" and expected.best_epoch == 2
    for got in (alone, reverse):
        assert (got.stop_reason, got.best_epoch, got.best_metric) == (
            expected.stop_reason,
            expected.best_epoch,
            expected.best_metric,
        )
        columns = ["epoch", "step", "train_loss", "lr", "skipped_steps", "score"]
        assert got.history[columns].equals(expected.history[columns])


def test_skipped_steps_are_counted_without_the_non_finite_guard(cpu_hw) -> None:
    policies = [p for p in default_policies(_cfg()) if not isinstance(p, NonFiniteGuard)]
    result = fit(InfOnCalls(3, 10), DataLoader(_data(), batch_size=8), config=_cfg(epochs=2), loss_fn=_mse, hw=cpu_hw,
                 policies=policies)  # fmt: skip
    assert (result.skipped_steps, result.steps) == (2, 14)
    assert result.history["skipped_steps"].tolist() == [1, 2]
