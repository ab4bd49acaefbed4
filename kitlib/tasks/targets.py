"""How a target column becomes what the model learns: class codes, or a standardised (log) number.

A raw price (median 47, max 5,925) trained with MSE gave constant or negative predictions (test SMAPE 107-117 on the
seed user's data); log1p then standardise gave SMAPE 24. So a regression target is always standardised, and also
log-transformed when it is non-negative and either heavy-tailed or scored by a relative metric (SMAPE, RMSLE).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

    from kitlib.config import Task as TargetRule
    from kitlib.data.tables import TaskSpec

HEAVY_TAIL_RATIO = 10.0  # p99 / median above this: a heavy right tail (prices, counts, sales)


def read_target(column: pd.Series, rule: TargetRule, metric: str) -> TaskSpec:
    """The target's kind and classes (kitlib.data.tables.infer_task: a DataError asking for task= when ambiguous),
    with the regression transform fitted on ``column``."""
    import dataclasses

    from kitlib.data.tables import infer_task
    from kitlib.tasks.metrics import LOG_TARGET_METRICS, target_rule

    spec = infer_task(column, target_rule(rule, metric))  # smape: a number, whole or not; accuracy: classes
    if spec.kind != "regression":
        return spec
    y = column.to_numpy(dtype=np.float64)
    if metric in LOG_TARGET_METRICS and y.min() < 0:
        print(
            f"note: metric {metric} scores relative errors, for which kitlib trains on log1p(target), but target "
            f"{column.name!r} has {int(np.sum(y < 0))} negative value(s) (min {y.min():g}) and that transform needs "
            "values >= 0: it trains on the standardised values instead. If negatives are errors, drop those rows"
        )
    log = bool(y.min() >= 0 and (metric in LOG_TARGET_METRICS or heavy_tailed(y)))
    z = np.log1p(y) if log else y
    return dataclasses.replace(spec, log=log, center=float(z.mean()), scale=float(max(z.std(), 1e-6)))


def heavy_tailed(values: np.ndarray) -> bool:
    return bool(np.percentile(values, 99) > HEAVY_TAIL_RATIO * max(float(np.median(np.abs(values))), 1e-9))
