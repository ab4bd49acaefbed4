"""report_to (a declared parameter): 02 logs each epoch's history row and the verdict where it says; none: nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_workflow import _csvs

from kitlib.errors import SetupError
from kitlib.notebook import reporting, stages, training
from kitlib.notebook.params import check_parameters


def _trained(tmp_path: Path, cpu_hw, **given: object) -> stages.Params:
    data = _csvs(tmp_path / "data", n_train=120)
    p = stages.params(environ={}, data_dir=data, work_dir=tmp_path / "w", preset="smoke", model="tiny", **given)
    stages.setup(p, cpu_hw)
    stages.features(p, hw=cpu_hw, quiet=True)
    training.train(p, hw=cpu_hw)
    return p


def test_tensorboard_reads_one_scalar_per_epoch_and_the_verdict(tmp_path: Path, cpu_hw) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    p = _trained(tmp_path, cpu_hw, epochs=2, report_to="tensorboard")
    events = EventAccumulator(str(p.work_dir / "tensorboard" / "run"))
    events.Reload()
    assert [e.step for e in events.Scalars("eval_loss")] == [1, 2]  # history.csv's rows, one point an epoch
    assert [e.step for e in events.Scalars("train_loss")] == [1, 2]
    assert "verdict/text_summary" in events.Tags()["tensors"]


def test_none_logs_nowhere(tmp_path: Path, cpu_hw) -> None:
    p = _trained(tmp_path, cpu_hw, epochs=1)
    assert not (p.work_dir / "tensorboard").exists()


def test_asked_for_and_not_installed_is_an_error_naming_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reporting, "find_spec", lambda name: None)
    with pytest.raises(SetupError, match=r"pip install wandb, or report_to = 'none'"):
        check_parameters({"report_to": "wandb"})
