"""The trivial baseline every run is scored against: what a constant answer scores on the run's validation rows.

    b = trivial_baseline(metric, kind="regression", train=y[train_idx], valid=y[valid_idx])
    b.score                      # e.g. smape 81.7 for "the constant 12 (the train value smape scores best)"
    b.verdict(model_score=85.6)  # one line saying the model does not beat it, and what to try

A model that loses to a constant has learnt nothing the metric rewards; on a text + tabular SMAPE table the model
scored 85.6 against the train median's 81.7 and nothing on screen said so. The constant is the task's: the majority
class, the most common training text, or for numbers the training value the metric scores best on the training rows
(the mean for rmse, the median for mae, something lower for smape): chosen on train, scored on validation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from kitlib.progress import figure

if TYPE_CHECKING:
    from kitlib.tasks.metrics import Metric

QUANTILES = np.linspace(0.0, 1.0, 41)  # candidate constants for numbers: every 2.5th percentile of train, and the mean
MAX_ROWS = 20_000  # rows the candidates are judged on (a sample beyond): 42 metric calls over them, well under 1 s
ADVICE = {
    "regression": "a loss that follows the metric (objective in 00: mae or log_mae for smape/mae)",
    "binary": "class balance and the metric (macro_f1 for rare classes)",
    "multiclass": "class balance and the metric (macro_f1 for rare classes)",
    "sequence": "more epochs or rows (a model from scratch learns every pattern from the rows)",
}


@dataclass(frozen=True)
class Baseline:
    what: str  # the constant, in words
    metric: str
    mode: str  # "max" or "min", the metric's
    score: float  # the constant's score on the validation rows

    def beaten_by(self, model_score: float | None) -> bool:
        if model_score is None or not np.isfinite(model_score):
            return False
        return model_score > self.score if self.mode == "max" else model_score < self.score

    def line(self) -> str:
        return f"trivial baseline ({self.what}): {self.metric} {figure(self.score)} on the same validation rows"

    def verdict(self, model_score: float | None, kind: str) -> str:
        """One line: by how much the model beats the constant, or that it does not, with what to try."""
        if self.beaten_by(model_score):
            assert model_score is not None
            return (
                f"the model ({self.metric} {figure(model_score)}) beats the trivial baseline ({self.what}: "
                f"{figure(self.score)}) by {figure(abs(model_score - self.score))}"
            )
        shown = "no score" if model_score is None else f"{self.metric} {figure(model_score)}"
        return (
            f"the model ({shown}) does not beat the trivial baseline ({self.what}: {figure(self.score)}): it has "
            f"learnt nothing the metric rewards. Try: the preset (balanced or best), more epochs or a larger lr, "
            f"{ADVICE.get(kind, 'the target column')}; check the inputs can predict the target"
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Baseline:
        return cls(str(data["what"]), str(data["metric"]), str(data["mode"]), float(data["score"]))


def trivial_baseline(metric: Metric, *, kind: str, train: np.ndarray, valid: np.ndarray) -> Baseline:
    """The task's constant answer, chosen on ``train`` and scored by ``metric`` on ``valid`` (both in the target's
    own units: class labels, numbers, texts)."""
    train, valid = np.asarray(train), np.asarray(valid)
    if kind == "regression":
        value, what = _best_constant(metric, train.astype(np.float64))
    else:
        values, counts = np.unique(train.astype(str) if kind == "sequence" else train, return_counts=True)
        value = values[int(np.argmax(counts))]
        what = f"the most common training {'target' if kind == 'sequence' else 'class'} {_short(value)}"
    constant = np.full(len(valid), value, dtype=object if kind != "regression" else np.float64)
    return Baseline(what, metric.name, metric.mode, metric(valid, constant))


def _best_constant(metric: Metric, y: np.ndarray) -> tuple[float, str]:
    judged = y if len(y) <= MAX_ROWS else np.random.default_rng(0).choice(y, MAX_ROWS, replace=False)
    candidates = [float(np.mean(judged)), *np.quantile(judged, QUANTILES).tolist()]
    scores = [metric(judged, np.full(len(judged), c)) for c in candidates]
    best = int(np.argmax(scores) if metric.mode == "max" else np.argmin(scores))
    value = candidates[best]
    if best == 0:
        return value, f"the train mean {value:.4g}"
    if QUANTILES[best - 1] == 0.5:
        return value, f"the train median {value:.4g}"
    return value, f"the constant {value:.4g}, the train value {metric.name} scores best"


def _short(value: Any) -> str:
    text = str(value)
    return repr(text if len(text) <= 40 else text[:37] + "...")
