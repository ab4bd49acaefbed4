"""How a target becomes what the model learns: class codes, or a standardised (log) number with a metric's loss."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np

from kitlib.data.tables import infer_target
from kitlib.tasks.metrics import LOG_TARGET_METRICS, check_metric_fits, target_rule

# lazy: torch (+1.0 s): only the regression loss needs it

if TYPE_CHECKING:
    from collections.abc import Callable

    import pandas as pd
    import torch

    from kitlib.config import TargetRule
    from kitlib.data.tables import TargetSpec

HEAVY_TAIL_RATIO = 10.0  # p99 / median above this: a heavy right tail (prices, counts, sales)
OBJECTIVES = ("auto", "mse", "mae", "log_mse", "log_mae")  # 00's ``objective``: the regression loss, and log1p or not
_BY_METRIC = {"rmse": "mse", "mae": "mae", "smape": "log_mae", "rmsle": "log_mse"}  # "auto": what each one rewards
_SAID = {"mse": "squared error", "mae": "absolute error"}


def objective_for(metric: str, y: np.ndarray, objective: str = "auto") -> tuple[bool, str]:
    """(log1p?, "mse" | "mae") for a target ``y`` scored by ``metric``: ``objective`` when given, else the metric's."""
    if objective != "auto":
        log, loss = objective.startswith("log_"), objective.removeprefix("log_")
    elif metric in _BY_METRIC:
        chosen = _BY_METRIC[metric]
        log, loss = chosen.startswith("log_") or (metric == "mae" and heavy_tailed(y)), chosen.removeprefix("log_")
    else:
        log, loss = heavy_tailed(y), "mse"
    return bool(log and y.min() >= 0), loss


def describe_objective(spec: TargetSpec, metric: str, objective: str = "auto") -> str:
    """01's line about what a regression target trains on, and why."""
    on = "log1p(target)" if spec.log else "the target"
    why = f"set by objective = {objective!r}" if objective != "auto" else f"what {metric} rewards"
    return (
        f"objective: {_SAID[spec.loss]} on {on}, standardised ({why}; objective = mse | mae | log_mse | log_mae in "
        "00 overrides it)"
    )


def regression_loss(spec: TargetSpec) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The training loss of a regression target: squared or absolute error on one output, in fp32."""
    import torch.nn.functional as F

    fn = F.l1_loss if spec.loss == "mae" else F.mse_loss
    return lambda logits, labels: fn(logits.squeeze(-1).float(), labels.float())


def read_target(column: pd.Series, rule: TargetRule, metric: str, objective: str = "auto") -> TargetSpec:
    """The target's kind and classes (a DataError asking for task= when ambiguous), with its transform and loss."""
    check_metric_fits(column.dropna().tolist(), str(column.name), rule, metric)
    spec = infer_target(column, target_rule(rule, metric))  # smape: a number, whole or not; accuracy: classes
    if spec.kind != "regression":
        return spec
    y = column.to_numpy(dtype=np.float64)
    log, loss = objective_for(metric, y, objective)
    if (metric in LOG_TARGET_METRICS or objective.startswith("log_")) and y.min() < 0:
        print(
            f"note: metric {metric} scores relative errors, for which kitlib trains on log1p(target), but target "
            f"{column.name!r} has {int(np.sum(y < 0))} negative value(s) (min {y.min():g}) and that transform needs "
            "values >= 0: it trains on the standardised values instead. If negatives are errors, drop those rows"
        )
    z = np.log1p(y) if log else y
    return dataclasses.replace(spec, log=log, center=float(z.mean()), scale=float(max(z.std(), 1e-6)), loss=loss)


def heavy_tailed(values: np.ndarray) -> bool:
    return bool(np.percentile(values, 99) > HEAVY_TAIL_RATIO * max(float(np.median(np.abs(values))), 1e-9))
