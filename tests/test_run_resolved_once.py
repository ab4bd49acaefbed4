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


def test_the_picker_previews_the_run_01_resolves_from_the_saved_choice(tmp_path: Path, cpu_hw) -> None:
    """A parameter (lr) and a picker click (micro-batch 3): the picker's preview, and the run 01 resolves from the
    choice setup saved (run.json) and the parameters it wrote (params.json), are one run for the same lengths."""
    p = _params(tmp_path, lr=0.002)
    facts = stages.data_facts(p)
    resolve = functools.partial(stages.resolve_run, p, cpu_hw)
    save = functools.partial(stages.setup, p, cpu_hw)
    picker = preset_picker(cpu_hw, default=p.preset, lengths=facts.lengths, resolve=resolve, save=save)
    picker._apply(p.preset, {"micro_batch_size": 3}, revert=None)  # the advanced field, clicked
    assert picker.resolved == stages.resolve_run(p, cpu_hw, facts.lengths, overrides={"micro_batch_size": 3})
    saved = picker.save()
    assert saved == presets.load_choice(p.work_dir) and saved.overrides == {"lr": 0.002, "micro_batch_size": 3}
    again = stages.load_params(p.work_dir, environ={})  # 01's parameters: the click is one of them now
    assert again.training() == {"lr": 0.002, "micro_batch_size": 3}
    assert stages.resolve_run(again, cpu_hw, facts.lengths, preset=saved.preset, overrides=saved.overrides) == (
        picker.resolved
    )
    assert stages.resolve_run(again, cpu_hw, facts.lengths) == picker.resolved  # from the parameters alone


def test_01_resolves_once_and_keeps_each_override(tmp_path: Path, cpu_hw, monkeypatch) -> None:
    """00 resolves nothing; 01 resolves the run once with the tokenizer's lengths (also when max_length is set: the
    mean tokens and cut rows then come from the tokenizer too), and every override given once reaches features.json's
    run unchanged."""
    p = _params(tmp_path, micro_batch_size=3, max_length=24, lr=0.002, epochs=2)
    calls: list[tuple[Any, presets.ResolvedRun]] = []
    real = stages.resolve_run

    def spy(*args: Any, **kwargs: Any) -> presets.ResolvedRun:
        calls.append((args, run := real(*args, **kwargs)))
        return run

    monkeypatch.setattr(stages, "resolve_run", spy)
    stages.setup(p, cpu_hw)
    assert calls == []
    feats = stages.features(p, hw=cpu_hw, quiet=True)
    (_, _, lengths), fitted = calls[-1][0], calls[-1][1]
    assert len(calls) == 1 and lengths is not None and fitted.mean_tokens is not None
    assert feats.run.config == fitted.config  # the task's tune changes nothing for a classifier
    again = real(stages.load_params(p.work_dir, environ={}), cpu_hw, lengths)  # from params.json alone
    assert dataclasses.replace(again, choice=fitted.choice) == fitted  # setup's choice adds the metric, the baseline
    cfg = json.loads((p.work_dir / "features.json").read_text())["run"]["config"]
    assert {k: cfg[k] for k in p.training()} == p.training() == dict(fitted.choice.overrides)


def test_setup_refuses_in_00_what_01_would_refuse_without_resolving(tmp_path: Path, cpu_hw) -> None:
    """kahan outside bf16 and an unknown override are refused by setup (presets.check), before anything is written."""
    p = _params(tmp_path, optimizer="adamw-kahan")
    with pytest.raises(SetupError, match="adamw-kahan"):
        stages.setup(p, cpu_hw)
    with pytest.raises(ValueError, match=r"unknown override\(s\) \['warmup_days'\]"):
        stages.setup(dataclasses.replace(p, optimizer=None), cpu_hw, overrides={"warmup_days": 2})
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
