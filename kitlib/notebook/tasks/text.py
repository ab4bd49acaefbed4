"""The text tasks: one text column -> a class or a number, optionally with tabular columns (``tabular-text``)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from kitlib.data.tables import MAX_INT_CLASSES
from kitlib.errors import SetupError, in_setup
from kitlib.models.folders import tiny_requested
from kitlib.notebook.handoff import SideInputs
from kitlib.notebook.tasks.base import Params, Task
from kitlib.tasks.metrics import METRICS
from kitlib.tasks.tabular import Columns, fit_columns
from kitlib.tasks.targets import read_target

# lazy: torch (+1.0 s): only the tabular head needs it

if TYPE_CHECKING:
    import pandas as pd
    from torch import nn

    from kitlib.data.tables import TargetSpec
    from kitlib.notebook.presets import Preset

# a text model from random weights (model "tiny"): the presets' 3e-5 to 1e-4 are for pretrained encoders
FROM_SCRATCH_LR = 1e-3


class TextTask(Task):
    """auto / classify / regress: the target read by its values or as told; named tabular columns are inputs too."""

    def __init__(self, name: str, target_rule: str) -> None:
        self.name, self.target_rule = name, target_rule  # type: ignore[assignment]

    def columns(self, p: Params) -> tuple[str, ...]:
        return (*p.numeric, *p.categorical)

    def preset(self, preset: Preset, p: Params) -> Preset:
        """A text model from random weights: nothing frozen, a from-scratch lr; smoke and adapters stay as they are."""
        scratch = p.model == "tiny" or (p.model == "auto" and tiny_requested())
        if not scratch or preset.regime != "finetune" or preset.row_limit is not None or p.adapter != "none":
            return preset
        return dataclasses.replace(preset, freeze="none", freeze_layers=0, lr=max(preset.lr, FROM_SCRATCH_LR))

    def side_inputs(self, p: Params, train: pd.DataFrame, test: pd.DataFrame) -> SideInputs:
        if not (p.numeric or p.categorical):
            return SideInputs()
        train_path, test_path = p.data_dir / p.train_file, p.data_dir / p.test_file
        cols = fit_columns(train, numeric=p.numeric, categorical=p.categorical, path=train_path)
        return SideInputs(cols.transform(train, path=train_path), cols.transform(test, path=test_path), cols.to_dict())

    def model(self, text_model: nn.Module, spec: TargetSpec, side: SideInputs, seed: int) -> nn.Module:
        import torch

        from kitlib.models.tabular import TabularNet, WithTabular

        if not side.state:
            return text_model
        cols = Columns.from_dict(side.state)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            net = TabularNet(cols.n_numeric_inputs, [c.cardinality for c in cols.categorical], spec.num_labels)
        return WithTabular(text_model, net, regression=spec.kind == "regression")


class TabularTextTask(TextTask):
    """Text plus tabular columns; a number target with over MAX_INT_CLASSES values regresses where ``auto`` asks."""

    def target(self, column: pd.Series, p: Params, metric: str) -> TargetSpec:
        quantity = column.dtype.kind in "iuf" and column.nunique() > MAX_INT_CLASSES and metric not in METRICS
        return read_target(column, "regress" if quantity else self.target_rule, metric)

    def check(self, p: Params) -> None:
        if not (p.numeric or p.categorical):
            raise SetupError(
                "task = 'tabular-text' needs the columns beside the text: set numeric = [...] and/or categorical = "
                f"[...] {in_setup('numeric')} (or use task = 'auto' for the text alone)"
            )
