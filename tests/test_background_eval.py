"""Background full evals (their result arrives late): judged in epoch order, and never lost by a resume."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from test_fit_policies import _data, _mse  # the same toy regression
from torch import nn
from torch.utils.data import DataLoader

from kitlib import Callback, TrainConfig, fit
from kitlib.engine import checkpoint
from kitlib.engine.evaluation import SplitEval
from kitlib.engine.events import StepEnd
from kitlib.engine.loop import FitResult, Loop


def _cfg(**kw: Any) -> TrainConfig:
    base: dict[str, Any] = {
        "epochs": 4,
        "micro_batch_size": 8,
        "lr": 5e-2,
        "precision": "fp32",
        "full_eval_every": 1,
        "monitor": "score",
        "mode": "max",
        "background_eval": "thread",
        "seed": 3,
    }
    return TrainConfig(**{**base, **kw})


def _weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# ------------------------------------------------------------------------------------------ epoch order


def test_a_late_background_result_is_judged_before_later_epochs_and_best_holds_its_weights(cpu_hw, tmp_path) -> None:
    """Epoch 2's score arrives after epoch 3 finished training. Early stopping (patience 1) and best/ must still see
    the scores in epoch order: epoch 2's (no improvement) ends the run at the next epoch boundary, before a 4th
    epoch trains, and best/ holds epoch 1's weights, not the weights current when epoch 1's verdict landed."""
    scores = {1: 0.5, 2: 0.4, 3: 0.45, 4: 0.9, 5: 0.9, 6: 0.9}  # epoch 4 would "rescue" a run that judged late
    release = threading.Event()
    calls: list[int] = []

    def measure(model: nn.Module) -> int:
        calls.append(epoch := len(calls) + 1)
        return epoch

    def score(epoch: int) -> dict[str, float]:
        if epoch == 2:
            release.wait(10)  # set during epoch 3's last step
            time.sleep(0.3)  # ... and the result lands only after epoch 3's end
        return {"score": scores[epoch]}

    full_eval = SplitEval(measure, score)

    seen: list[tuple[int, bool]] = []
    at_end: dict[int, dict[str, torch.Tensor]] = {}

    class Watch(Callback):
        def on_fit_start(self, loop: Loop) -> None:
            self.loop = loop

        def on_step_end(self, step: StepEnd) -> None:
            if self.loop.state.epoch == 2 and self.loop.state.batch_in_epoch == 8:  # epoch 3's last step
                release.set()

        def on_metrics(self, epoch: int, metrics: Mapping[str, float], weights: object) -> None:
            seen.append((epoch, "score" in metrics))

        def on_epoch_end(self, record: Mapping[str, Any]) -> None:
            at_end[record["epoch"]] = _weights(self.loop.raw_model)

    torch.manual_seed(0)
    result = fit(nn.Linear(4, 1), DataLoader(_data(), batch_size=8), config=_cfg(epochs=6, patience=1),
                 loss_fn=_mse, full_eval=full_eval, hw=cpu_hw, run_dir=tmp_path, callbacks=[Watch()])  # fmt: skip

    assert [e for e, _ in seen] == sorted(e for e, _ in seen), seen  # every epoch's metrics after earlier epochs'
    assert result.stop_reason == "early_stopping"
    # epoch 2's verdict is known at epoch 3's end (one epoch behind: that is what running it in the background buys)
    assert result.history["epoch"].tolist() == [1, 2, 3]
    assert result.history["score"].tolist() == [0.5, 0.4, 0.45]
    assert (result.best_epoch, result.best_metric) == (1, 0.5)
    best = checkpoint.load(tmp_path / "best")
    assert best.meta["epoch"] == 1
    for name, tensor in at_end[1].items():
        assert torch.equal(best.weights[name], tensor), name
    assert not torch.equal(best.weights["weight"], result.model.weight.detach())

    # the same decisions as scoring in the foreground: best epoch 1, stopped by epoch 2's verdict (there one epoch
    # earlier, since nothing is pending)
    calls.clear()
    torch.manual_seed(0)
    sync = fit(nn.Linear(4, 1), DataLoader(_data(), batch_size=8),
               config=_cfg(epochs=6, patience=1, background_eval="off"), loss_fn=_mse, full_eval=full_eval,
               hw=cpu_hw)  # fmt: skip
    assert (sync.stop_reason, sync.best_epoch, sync.history["epoch"].tolist()) == ("early_stopping", 1, [1, 2])


# ------------------------------------------------------------------------------------------ resume


def _measure(model: nn.Module) -> float:
    """A deterministic function of the weights (the accelerator half)..."""
    x, y = _data(16, 1).tensors
    return -round(float(nn.functional.mse_loss(model(x), y)), 1)  # rounded: equal scores happen


def _slow(value: float) -> dict[str, float]:
    """... scored slowly in the background."""
    time.sleep(0.2)  # still pending when the next checkpoint is taken
    return {"score": value}


_score = SplitEval(_measure, _slow)


class Crash(Callback):
    """Ends the session right after a last/ save: at an epoch end (``epoch``) or at an optimizer step (``step``)."""

    def __init__(self, epoch: int | None = None, step: int | None = None) -> None:
        self.epoch, self.step = epoch, step

    def on_fit_start(self, loop: Loop) -> None:
        self.loop = loop

    def on_step_end(self, step: StepEnd) -> None:  # after kitlib's periodic save (policies run first)
        if self.loop.state.step == self.step:
            raise KeyboardInterrupt("the session ended")

    def on_next_epoch(self, loop: Loop) -> None:  # after kitlib's epoch-end save
        if loop.state.epoch == self.epoch:
            raise KeyboardInterrupt("the session ended")


def _run(run_dir: Path, hw: Any, crash: Crash | None = None, resume: bool = False) -> FitResult:
    torch.manual_seed(0)
    return fit(nn.Linear(4, 1), DataLoader(_data(), batch_size=8, shuffle=True),
               config=_cfg(save_last=True, save_every_steps=5), loss_fn=_mse, full_eval=_score, hw=hw,
               run_dir=run_dir, resume=resume, callbacks=[crash] if crash else [])  # fmt: skip


def _same_run(expected: FitResult, got: FitResult, expected_dir: Path, got_dir: Path) -> None:
    columns = ["epoch", "step", "train_loss", "score"]
    assert got.history["score"].notna().all(), got.history
    assert got.history[columns].equals(expected.history[columns]), (expected.history, got.history)
    assert (got.best_epoch, got.best_metric) == (expected.best_epoch, expected.best_metric)
    best, want = checkpoint.load(got_dir / "best"), checkpoint.load(expected_dir / "best")
    assert best.meta["epoch"] == want.meta["epoch"] == expected.best_epoch
    assert all(torch.equal(t, best.weights[n]) for n, t in want.weights.items())
    assert all(torch.equal(t, got.model.state_dict()[n]) for n, t in expected.model.state_dict().items())


@pytest.mark.parametrize(
    "crash",
    [Crash(epoch=2), Crash(step=10)],  # 8 steps an epoch: step 10 is mid-epoch 2, after the save at step 10
    ids=["epoch_end_save", "mid_epoch_save"],
)
def test_a_resume_from_a_last_saved_while_a_background_eval_was_pending_keeps_its_result(
    cpu_hw, tmp_path: Path, crash: Crash
) -> None:
    expected = _run(tmp_path / "full", cpu_hw)
    assert expected.history["score"].notna().all()
    with pytest.raises(KeyboardInterrupt):
        _run(tmp_path / "cut", cpu_hw, crash)
    got = _run(tmp_path / "cut", cpu_hw, resume=True)
    _same_run(expected, got, tmp_path / "full", tmp_path / "cut")


def test_the_last_checkpoint_of_a_finished_run_holds_every_score(cpu_hw, tmp_path: Path) -> None:
    """The end-of-run save waits for the pending eval: resuming a finished run (the same cell run again with
    resume="auto") neither loses the last score nor evaluates again."""
    result = _run(tmp_path, cpu_hw)
    last = checkpoint.load(tmp_path / "last")
    assert last.state is not None
    scores = [row.get("score") for row in last.state["run"]["history"]]
    assert scores == result.history["score"].tolist()
    calls: list[int] = []

    def counted(model: nn.Module) -> float:
        calls.append(1)
        return _measure(model)

    again = fit(nn.Linear(4, 1), DataLoader(_data(), batch_size=8, shuffle=True),
                config=_cfg(save_last=True, save_every_steps=5), loss_fn=_mse, full_eval=SplitEval(counted, _slow),
                hw=cpu_hw, run_dir=tmp_path, resume=True)  # fmt: skip
    assert calls == [] and again.history["score"].tolist() == result.history["score"].tolist()


# ------------------------------------------------------------------------------------------ the component


def _sampling(model: nn.Module) -> float:
    """A sampling eval's foreground half: its draw depends on the RNG streams it starts from."""
    return float(model(torch.randn(1, 4)).sum())


def _score_late(value: float) -> dict[str, float]:
    time.sleep(0.2)
    return {"score": value}


def test_background_eval_state_dict_round_trip_resumes_an_unscored_eval(tmp_path: Path) -> None:
    """An eval still scoring when a checkpoint is taken travels in BackgroundEval's state_dict (through a real
    checkpoint); a fresh component loaded from it scores that epoch again, with the RNG it first ran with, and
    hands the same metrics to collect; one whose weights are gone (resumed mid-epoch) is reported, not invented."""
    from kitlib.engine.evaluation import BackgroundEval
    from kitlib.engine.timing import PhaseTimer
    from kitlib.machine.distributed import DistEnv

    torch.manual_seed(0)
    model, split = nn.Linear(4, 1), SplitEval(_sampling, _score_late)
    running = BackgroundEval(split, "thread", env=DistEnv(), timer=PhaseTimer())
    measured = running.measure(model, contextlib.nullcontext)
    assert measured is not None and running.score(2, measured, lambda: None) == {}  # queued in the pool
    checkpoint.write(checkpoint.snapshot(model, state={"background_eval": running.state_dict()}), tmp_path / "last")
    expected = running.collect()
    running.close()

    saved = checkpoint.load(tmp_path / "last").state
    assert saved is not None and [u["epoch"] for u in saved["background_eval"]["unscored"]] == [2]
    torch.manual_seed(1)  # the resumed session's streams are elsewhere
    resumed = BackgroundEval(split, "thread", env=DistEnv(), timer=PhaseTimer())
    resumed.load_state_dict(saved["background_eval"])
    resumed.rescore(model, contextlib.nullcontext, at_epoch_end=2, weights=lambda epoch: None, where="last/")
    assert resumed.collect() == expected and expected[0][0] == 2
    resumed.close()

    mid_epoch = BackgroundEval(split, "thread", env=DistEnv(), timer=PhaseTimer())
    mid_epoch.load_state_dict(saved["background_eval"])
    with pytest.warns(UserWarning, match="epoch 2 was still running"):
        mid_epoch.rescore(model, contextlib.nullcontext, at_epoch_end=None, weights=lambda epoch: None, where="x")
    assert mid_epoch.collect() == []


def test_a_full_eval_that_returns_a_callable_is_told_to_declare_a_split_eval(cpu_hw) -> None:
    from kitlib.errors import SetupError

    with pytest.raises(SetupError, match=r"SplitEval\(measure, score\)"):
        fit(nn.Linear(4, 1), DataLoader(_data(), batch_size=8), config=_cfg(epochs=1), loss_fn=_mse, hw=cpu_hw,
            full_eval=lambda model: (lambda: {"score": 1.0}))  # type: ignore[arg-type,return-value]  # fmt: skip


def _as_eval_loss(value: float) -> dict[str, float]:
    return {"eval_loss": value}


@pytest.mark.parametrize("mode", ["off", "thread"])
def test_an_epoch_whose_background_eval_reports_the_monitor_too_is_judged_once(cpu_hw: Any, mode: str) -> None:
    """A SplitEval whose score reports the monitored eval_loss too (the cheap eval's is in the epoch's row already):
    each epoch is judged once, in the background as in the foreground, so early stopping counts epochs, not values.
    Every epoch improves on both evals here: patience 1 never stops the run."""
    values = iter([1.0, 0.5, 0.4, 0.3, 0.2, 0.1])  # the full eval's eval_loss, better every epoch
    cfg = _cfg(epochs=6, lr=1e-2, monitor="eval_loss", mode="min", patience=1, background_eval=mode)
    torch.manual_seed(0)
    result = fit(nn.Linear(4, 1), DataLoader(_data(), batch_size=8), config=cfg, loss_fn=_mse, hw=cpu_hw,
                 eval_loader=DataLoader(_data(seed=1), batch_size=8),
                 full_eval=SplitEval(lambda model: next(values), _as_eval_loss))  # fmt: skip
    assert (result.stop_reason, len(result.history)) == ("completed", 6), result.history
    assert result.best_epoch == 6


def test_a_late_value_of_an_epoch_judged_already_leaves_best_with_that_epochs_weights(
    cpu_hw: Any, tmp_path: Path
) -> None:
    """Epoch 2 is the best by its row's eval_loss; its background eval reports the same eval_loss an epoch later,
    when the model holds epoch 3's weights: best/ keeps epoch 2's."""
    cheap = iter([3.0, 1.0, 2.0])  # the epoch-end eval_loss: one eval batch, one value per epoch

    def loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return _mse(model, batch) if model.training else torch.tensor(next(cheap))

    full = iter([3.0, 1.0, 2.0])  # the full eval's eval_loss: the same pass, the same values
    at_end: dict[int, dict[str, torch.Tensor]] = {}

    class Watch(Callback):
        def on_fit_start(self, loop: Loop) -> None:
            self.loop = loop

        def on_epoch_end(self, record: Mapping[str, Any]) -> None:
            at_end[record["epoch"]] = _weights(self.loop.raw_model)

    cfg = _cfg(epochs=3, monitor="eval_loss", mode="min")
    torch.manual_seed(0)
    result = fit(nn.Linear(4, 1), DataLoader(_data(), batch_size=8), config=cfg, loss_fn=loss, hw=cpu_hw,
                 eval_loader=DataLoader(_data(seed=1), batch_size=64), run_dir=tmp_path, callbacks=[Watch()],
                 full_eval=SplitEval(lambda model: next(full), _as_eval_loss))  # fmt: skip
    assert (result.best_epoch, result.best_metric) == (2, 1.0)
    best = checkpoint.load(tmp_path / "best")
    for name, tensor in at_end[2].items():
        assert torch.equal(best.weights[name], tensor), name


def test_process_mode_is_gone_and_the_error_lists_the_modes() -> None:
    """#50 list B8: no route could use a process pool (the notebooks' scores are closures that do not pickle)."""
    from kitlib.config import TrainConfig

    with pytest.raises(ValueError, match=r"background_eval='process' is not one of \('off', 'thread'\)"):
        TrainConfig(background_eval="process")  # type: ignore[arg-type]
