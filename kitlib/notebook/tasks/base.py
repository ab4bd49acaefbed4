"""What a notebook task is: the few things that differ between workloads, behind one interface.

The stages (kitlib.notebook.stages) read and check the files, tokenize, cache, train with ``fit`` and write the
submission the same way for every task; a task says only what is its own:

    columns(p)                  input columns besides text/target/id, checked in 00 before anything is written
    target(column, p, metric)   how the target column is read and transformed for training (a TaskSpec)
    side_inputs(p, train, test) per-row arrays beside the tokens (numeric features, category ids), fitted on train
    model(text_model, ...)      the model to train around the regime's text model (its ``.loss`` is the task's loss)
    submission(outputs, spec)   the model's test outputs -> the submission column

A new task subclasses ``Task`` in a module of its own and is named in 00's parameters as ``task="module:name"``
(an instance, a class or a factory): nothing in the engine, the stages or the notebooks changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    import pandas as pd
    from torch import nn

    from kitlib.config import Task as TargetRule
    from kitlib.data.tables import TaskSpec


class Params(Protocol):
    """What a task may read of the notebooks' parameters (kitlib.notebook.params.Params has it all)."""

    @property
    def data_dir(self) -> Path: ...
    @property
    def train_file(self) -> str: ...
    @property
    def test_file(self) -> str: ...
    @property
    def text(self) -> str: ...
    @property
    def target(self) -> str: ...
    @property
    def numeric(self) -> tuple[str, ...]: ...
    @property
    def categorical(self) -> tuple[str, ...]: ...


@dataclass(frozen=True)
class SideInputs:
    """Per-row model inputs besides the tokens: the arrays are saved by 01 and batched beside the tokens by 02/03
    (``model(input_ids=..., **side)``); ``state`` is the JSON-able fit (statistics, category lists) 02 rebuilds the
    model from."""

    train: Mapping[str, np.ndarray] = field(default_factory=dict)
    test: Mapping[str, np.ndarray] = field(default_factory=dict)
    state: Mapping[str, Any] = field(default_factory=dict)


class Task:
    """The text-to-label task (today's default): one text column to a class or a number."""

    name: str = "auto"
    target_rule: TargetRule = "auto"  # how kitlib.data.tables.infer_task reads the target column
    description: str = "one text column -> a class or a number (read from the target's values)"

    def check(self, p: Params) -> None:
        """Parameters this task needs or refuses, before any file is read (a SetupError naming the fix)."""

    def columns(self, p: Params) -> tuple[str, ...]:
        return ()

    def target(self, column: pd.Series, p: Params, metric: str) -> TaskSpec:
        from kitlib.tasks.targets import read_target

        return read_target(column, self.target_rule, metric)

    def side_inputs(self, p: Params, train: pd.DataFrame, test: pd.DataFrame) -> SideInputs:
        return SideInputs()

    def model(self, text_model: nn.Module, spec: TaskSpec, side: SideInputs, seed: int) -> nn.Module:
        return text_model

    def submission(self, outputs: np.ndarray, spec: TaskSpec) -> np.ndarray:
        """Mean model outputs over runs (class probabilities, or one value per row) -> the submission's values."""
        return spec.decode(outputs if spec.kind == "regression" else outputs.argmax(-1))
