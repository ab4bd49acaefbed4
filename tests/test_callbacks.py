"""fit's named events: the one protocol kitlib's policies and users' callbacks share."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from kitlib import TrainConfig, fit
from kitlib.engine.events import Callback, StepEnd
from kitlib.engine.loop import Loop
from kitlib.engine.policies import (
    BestCheckpoint,
    EarlyStopping,
    NonFiniteGuard,
    PeriodicSave,
    ProgressLog,
    StopAndSave,
    default_policies,
)
from kitlib.errors import NonFiniteLossError


def _loader(n: int = 32) -> DataLoader[Any]:
    x = torch.randn(n, 4, generator=torch.Generator().manual_seed(0))
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)


def _mse(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return nn.functional.mse_loss(model(batch[0]), batch[1])


def _cfg(**kw: Any) -> TrainConfig:
    return TrainConfig(**{"epochs": 2, "micro_batch_size": 8, "lr": 1e-2, "precision": "fp32", **kw})


class Recorder(Callback):
    def __init__(self) -> None:
        self.events: list[str] = []

    def on_fit_start(self, loop: Loop) -> None:
        self.events.append("fit_start")

    def on_epoch_start(self, loop: Loop) -> None:
        self.events.append(f"epoch_start {loop.state.epoch}")

    def on_step_end(self, step: StepEnd) -> None:
        self.events.append("step")

    def on_log(self, metrics: Mapping[str, float]) -> None:
        self.events.append("log")

    def on_metrics(self, epoch: int, metrics: Mapping[str, float], weights: object) -> None:
        self.events.append(f"metrics {epoch}")

    def on_epoch_end(self, record: Mapping[str, Any]) -> None:
        self.events.append(f"epoch_end {record['epoch']}")

    def on_next_epoch(self, loop: Loop) -> None:
        self.events.append(f"next {loop.state.epoch}")

    def on_fit_end(self, loop: Loop) -> None:
        self.events.append("fit_end")


def test_a_user_callback_receives_the_named_events_in_order(cpu_hw) -> None:
    recorder = Recorder()
    fit(nn.Linear(4, 1), _loader(), config=_cfg(log_every_steps=2), loss_fn=_mse, hw=cpu_hw, callbacks=[recorder])
    # 4 windows per epoch, a log every 2 applied steps: the loop fires on_log after that step's on_step_end
    epoch = ["step", "step", "log", "step", "step", "log"]
    assert recorder.events == [
        "fit_start",
        *("epoch_start 0", *epoch, "metrics 1", "epoch_end 1", "next 1"),  # state.epoch: epochs completed
        *("epoch_start 1", *epoch, "metrics 2", "epoch_end 2", "next 2"),  # shown and recorded: 1-based
        "fit_end",
    ]


def test_a_user_callback_stops_training_with_its_reason(cpu_hw) -> None:
    class StopAfter(Callback):
        def on_fit_start(self, loop: Loop) -> None:
            self.loop = loop

        def on_step_end(self, step: StepEnd) -> None:
            if self.loop.state.step == 3:
                self.loop.stop("enough")

    result = fit(nn.Linear(4, 1), _loader(), config=_cfg(epochs=5), loss_fn=_mse, hw=cpu_hw, callbacks=[StopAfter()])
    assert result.stop_reason == "enough"
    assert result.steps == 3 and len(result.history) == 1  # the epoch's record is written, no further epoch


def test_callbacks_written_for_earlier_versions_still_work(cpu_hw) -> None:
    """Objects with only on_log / on_epoch_end (no base class) are called as before."""

    class Old:
        def __init__(self) -> None:
            self.logs, self.epochs = 0, 0

        def on_log(self, metrics: Mapping[str, float]) -> None:
            self.logs += 1

        def on_epoch_end(self, record: Mapping[str, Any]) -> None:
            self.epochs += 1

    old = Old()
    fit(nn.Linear(4, 1), _loader(), config=_cfg(log_every_steps=1), loss_fn=_mse, hw=cpu_hw, callbacks=[old])
    assert (old.logs, old.epochs) == (8, 2)


def test_kitlibs_own_policies_are_callbacks_on_the_same_protocol() -> None:
    plain = default_policies(_cfg())
    assert [type(p) for p in plain] == [NonFiniteGuard, ProgressLog, BestCheckpoint, PeriodicSave, StopAndSave]
    full = default_policies(_cfg(patience=2, time_budget_s=60.0))
    assert [type(p) for p in full] == [
        NonFiniteGuard,
        ProgressLog,
        BestCheckpoint,
        EarlyStopping,
        PeriodicSave,
        StopAndSave,
    ]
    assert all(isinstance(p, Callback) for p in full)


def test_on_fit_end_runs_when_training_raises(cpu_hw) -> None:
    class Nan(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(4, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.linear(x) * float("nan")

    recorder = Recorder()
    with pytest.raises(NonFiniteLossError):
        fit(Nan(), _loader(), config=_cfg(max_nonfinite_steps=2), loss_fn=_mse, hw=cpu_hw, callbacks=[recorder])
    # the guard (before user callbacks) raised in the second step: that step never reached the recorder
    assert recorder.events[-1] == "fit_end" and recorder.events.count("step") == 1


def test_the_run_record_is_typed_and_reads_older_files(cpu_hw) -> None:
    from kitlib.engine.record import RunFacts

    result = fit(nn.Linear(4, 1), _loader(), config=_cfg(), loss_fn=_mse, hw=cpu_hw)
    written = result.timing["run"]
    facts = RunFacts.from_dict(written)
    assert facts.to_dict() == {k: written[k] for k in facts.to_dict()}  # every field round-trips through timing.json
    assert (facts.steps, facts.epochs_done, facts.samples, facts.stop_reason) == (8, 2, 64, "completed")
    old = RunFacts.from_dict({"steps": 3, "a_fact_from_the_future": 1})  # an older or newer file: no crash
    assert old.steps == 3 and old.epoch_gaps_s == [] and old.device_type is None


def test_the_history_and_logs_show_the_lr_each_step_ran_with() -> None:
    # get_last_lr() is the *next* step's lr: the last epoch's row read 0.0 (a linear decay's end), as if it trained
    # at lr 0. Each row and log shows what the optimizer used at its last step.
    class Used(Callback):
        def __init__(self) -> None:
            self.steps: list[float] = []  # the lr of every optimizer step, read inside optimizer.step
            self.at_epoch_end: list[float] = []
            self.logs: list[tuple[float, float]] = []

        def on_fit_start(self, loop: Loop) -> None:
            loop.optimizer.register_step_pre_hook(
                lambda opt, args, kwargs: self.steps.append(float(opt.param_groups[0]["lr"]))
            )

        def on_log(self, metrics: Mapping[str, float]) -> None:
            self.logs.append((metrics["lr"], self.steps[-1]))

        def on_epoch_end(self, record: Mapping[str, Any]) -> None:
            self.at_epoch_end.append(self.steps[-1])

    used = Used()
    result = fit(nn.Linear(4, 1), _loader(), config=_cfg(epochs=3, log_every_steps=2), loss_fn=_mse, callbacks=[used])
    assert len(used.steps) == 12 and used.steps[-1] > 0
    assert result.history["lr"].tolist() == pytest.approx(used.at_epoch_end, rel=1e-12)
    assert used.logs and all(shown == pytest.approx(ran, rel=1e-12) for shown, ran in used.logs)


def test_a_callback_whose_on_fit_end_raises_still_leaves_the_runs_files_complete(tmp_path, cpu_hw) -> None:
    """fit closes the checkpoint writer and the background eval after on_fit_end, also when a callback's on_fit_end
    raises: its error reaches the user, and no writer thread is left holding a half-written last/."""

    class FailsAtTheEnd(Callback):
        def on_fit_end(self, loop: Loop) -> None:
            raise RuntimeError("a user's callback failed")

    with pytest.raises(RuntimeError, match="a user's callback failed"):
        fit(nn.Linear(4, 1), _loader(), config=_cfg(epochs=2, save_last=True), loss_fn=_mse, hw=cpu_hw,
            run_dir=tmp_path, callbacks=[FailsAtTheEnd()])  # fmt: skip
    writers = [t for t in threading.enumerate() if t.name.startswith("kitlib-checkpoint-writer")]  # (_0: a pool's)
    assert not writers and (tmp_path / "last").is_dir()
