"""Issue #29 item 2: one function (stages.resolve_run) resolves the run for the picker, 00 and 01; the overrides merge
once in it; fit's micro-batch is the run's, one number from one source."""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from test_workflow import _csvs
from torch.utils.data import DataLoader

from kitlib.config import TrainConfig
from kitlib.engine.loop import fit
from kitlib.errors import SetupError
from kitlib.notebook import presets, stages
from kitlib.notebook.widgets import preset_picker


def _params(tmp_path: Path, **training: Any) -> stages.Params:
    data = _csvs(tmp_path / "data", n_train=300)
    return stages.params(environ={}, data_dir=data, work_dir=tmp_path / "w", preset="smoke", model="tiny", **training)


def _bare(run: presets.ResolvedRun) -> presets.ResolvedRun:
    """The run without what setup adds from the data (the metric's name, the baseline, the task's name)."""
    return dataclasses.replace(run, task="auto", metric="auto", baseline=None)


def test_the_picker_00_and_01_resolve_one_run_from_the_same_inputs(tmp_path: Path, cpu_hw, monkeypatch) -> None:
    """A parameter (lr) and a picker click (micro-batch 3) resolve to one run: the picker's, the one setup saves,
    and the one 01 resolves again from the saved params.json and run.json are equal objects for the same lengths."""
    p = _params(tmp_path, lr=0.002)
    facts = stages.data_facts(p)
    resolve = functools.partial(stages.resolve_run, p, cpu_hw)
    picker = preset_picker(cpu_hw, default=p.preset, lengths=facts.lengths, resolve=resolve, show=False)
    picker._apply(p.preset, {"micro_batch_size": 3}, revert=None)  # the advanced field, clicked
    assert picker.resolved == stages.resolve_run(p, cpu_hw, facts.lengths, overrides={"micro_batch_size": 3})
    saved = stages.setup(p, cpu_hw, resolved=picker.resolved)
    assert _bare(saved) == picker.resolved == _bare(presets.load_run(p.work_dir))
    again = stages.load_params(p.work_dir, environ={})  # 01's parameters: the click is one of them now
    assert again.training() == {"lr": 0.002, "micro_batch_size": 3}
    assert stages.resolve_run(again, cpu_hw, facts.lengths, preset=saved.preset, overrides=saved.overrides) == (
        picker.resolved
    )
    assert stages.resolve_run(again, cpu_hw, facts.lengths) == picker.resolved  # from the parameters alone


def test_01_fits_the_run_with_the_same_function_and_keeps_each_override(tmp_path: Path, cpu_hw, monkeypatch) -> None:
    """01 resolves the run again with the tokenizer's lengths through resolve_run (also when max_length is set: the
    mean tokens and cut rows then come from the tokenizer too), and every override given once reaches features.json's
    run unchanged."""
    p = _params(tmp_path, micro_batch_size=3, max_length=24, lr=0.002, epochs=2)
    calls: list[tuple[Any, presets.ResolvedRun]] = []
    real = stages.resolve_run

    def spy(*args: Any, **kwargs: Any) -> presets.ResolvedRun:
        calls.append((args, run := real(*args, **kwargs)))
        return run

    monkeypatch.setattr(stages, "resolve_run", spy)
    shown = stages.setup(p, cpu_hw)
    assert shown.mean_tokens is None  # 00 without a picker knows no lengths
    feats = stages.features(p, hw=cpu_hw, quiet=True)
    (_, _, lengths), fitted = calls[-1][0], calls[-1][1]
    assert len(calls) == 2 and lengths is not None and fitted.mean_tokens is not None
    assert feats.run.config == fitted.config  # the task's tune changes nothing for a classifier
    assert real(stages.load_params(p.work_dir, environ={}), cpu_hw, lengths) == fitted
    cfg = json.loads((p.work_dir / "features.json").read_text())["run"]["config"]
    assert {k: cfg[k] for k in p.training()} == p.training() == dict(fitted.overrides)


def test_setup_refuses_a_run_resolved_without_the_parameters(tmp_path: Path, cpu_hw) -> None:
    """No second merge in setup: a run resolved from the preset alone lacks the parameters' lr, and setup says how to
    resolve it rather than merging them in again (nothing is written)."""
    p = _params(tmp_path, lr=0.002)
    with pytest.raises(SetupError, match=r"resolve it with stages.resolve_run\(p, hw\)"):
        stages.setup(p, cpu_hw, resolved=presets.resolve(p.preset, cpu_hw))
    assert not (p.work_dir / "run.json").exists()


class _Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x).squeeze(-1)


def _loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])


def _rows(n: int) -> list[dict[str, torch.Tensor]]:
    return [{"x": torch.randn(2), "y": torch.randn(())} for _ in range(n)]


def test_fit_takes_the_micro_batch_from_the_run_and_refuses_a_loader_of_another(tmp_path: Path, cpu_hw) -> None:
    """fit's micro-batch is the config's: a loader of another batch size is refused, naming both numbers and the
    fix; without a config the loader's batch is the run's, and run/config.json records it."""
    loader = DataLoader(_rows(16), batch_size=4)
    with pytest.raises(ValueError, match=r"hold 4 rows, config.micro_batch_size is 8"):
        fit(_Tiny(), loader, config=TrainConfig(epochs=1, micro_batch_size=8), loss_fn=_loss, hw=cpu_hw)
    result = fit(_Tiny(), loader, loss_fn=_loss, hw=cpu_hw, run_dir=tmp_path / "run")
    assert json.loads((tmp_path / "run" / "config.json").read_text())["config"]["micro_batch_size"] == 4
    assert result.steps == 4 * TrainConfig().epochs  # 16 rows in batches of 4, each its own step
