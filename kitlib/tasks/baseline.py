"""The constant baseline every run is scored against, and whether the model beats it beyond a 90% interval."""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from kitlib.progress import figure

if TYPE_CHECKING:
    from kitlib.tasks.metrics import Metric

QUANTILES = np.linspace(0.0, 1.0, 41)  # candidate constants for numbers: every 2.5th percentile of train, and the mean
REFINE = 21  # then this many evenly spaced between the best candidate's neighbours, twice: the 1-D search
MAX_ROWS = 20_000  # rows the candidates are judged on (a sample beyond): ~84 metric calls over them, well under 1 s
ROUNDS = 1000  # bootstrap resamples of the validation rows
LEVEL = 90  # percent: the interval's coverage
ROW_MEAN = frozenset({"accuracy", "mae", "smape", "exact_match", "rouge_l"})  # means of per-row scores
BUDGET_S = 10.0  # seconds of metric calls the bootstrap of any other metric may take (at least 100 rounds)
# What to try when the model does not clearly win, with the run facts meaning it was done (``done``)
TRIES = (
    ("the balanced preset", frozenset({"balanced", "best"})),
    ("the best preset", frozenset({"best"})),
    ("more epochs or a larger lr", frozenset[str]()),
)
ADVICE = {
    "regression": ("an absolute-error loss (objective in 00: mae, or log_mae for smape)", frozenset({"mae"})),
    "binary": ("class balance and the metric (macro_f1 for rare classes)", frozenset[str]()),
    "multiclass": ("class balance and the metric (macro_f1 for rare classes)", frozenset[str]()),
    "sequence": ("more rows (a model from scratch learns every pattern from the rows)", frozenset[str]()),
}


@dataclass(frozen=True)
class Gap:
    """Model minus baseline score on the validation rows (> 0: model better); ``low``..``high``: LEVEL% interval."""

    gain: float
    low: float
    high: float
    rows: int

    def line(self) -> str:
        return (
            f"{_signed(self.gain)} better than the baseline ({LEVEL}% interval {_signed(self.low)} to "
            f"{_signed(self.high)} over {self.rows} validation rows)"
        )


@dataclass(frozen=True)
class Baseline:
    what: str  # the constant, in words
    metric: str
    mode: str  # "max" or "min", the metric's
    score: float  # the constant's score on the validation rows
    value: Any = None  # the constant itself (a number, a class, a text); None in a run.json from an older kitlib

    def constant(self, rows: int) -> np.ndarray:
        return np.full(rows, self.value, dtype=np.float64 if isinstance(self.value, float) else object)

    def beaten_by(self, model_score: float | None) -> bool:
        if model_score is None or not np.isfinite(model_score):
            return False
        return model_score > self.score if self.mode == "max" else model_score < self.score

    def line(self) -> str:
        return f"trivial baseline ({self.what}): {self.metric} {figure(self.score)} on the same validation rows"

    def verdict(
        self, model_score: float | None, kind: str, gap: Gap | None = None, done: Collection[str] = ()
    ) -> str | None:
        """One line when the model does not clearly beat the constant, with what the run has not tried; else None."""
        if (gap.low > 0) if gap is not None else self.beaten_by(model_score):
            return None
        shown = "no score" if model_score is None else f"{self.metric} {figure(model_score)}"
        if gap is not None and gap.high > 0:  # a tie (0 to 0: the constant itself) is no win
            head = (
                f"unclear whether the model ({shown}) beats the trivial baseline ({self.what}: "
                f"{figure(self.score)}): {gap.line()}, a difference the validation rows cannot tell from noise"
            )
        else:
            head = (
                f"the model ({shown}) does not beat the trivial baseline ({self.what}: {figure(self.score)})"
                f"{f', {gap.line()}' if gap else ''}: it has learnt nothing the metric rewards"
            )
        options = (*TRIES, ADVICE.get(kind, ("the target column", frozenset[str]())))
        tries = [text for text, did in options if not did & set(done)]
        return f"{head}. Try: {', '.join(tries)}; check the inputs can predict the target"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Baseline:
        return cls(str(data["what"]), str(data["metric"]), str(data["mode"]), float(data["score"]), data.get("value"))


def compare(metric: Metric, y_true: Any, model: Any, baseline: Any, *, seed: int = 0) -> Gap:
    """The model's score minus the baseline's (> 0: model better) with its LEVEL% bootstrap interval over ROUNDS."""
    y_true, model, baseline = np.asarray(y_true), np.asarray(model), np.asarray(baseline)
    sign, n = (1.0 if metric.mode == "max" else -1.0), len(y_true)
    rng = np.random.default_rng(seed)

    def gain(rows: Any) -> Any:
        return sign * (metric.scores(y_true[rows], model[rows]) - metric.scores(y_true[rows], baseline[rows]))

    whole = gain(slice(None))  # each row's gain when the metric gives each row's score (a user's may)
    if whole.ndim or metric.name in ROW_MEAN:  # a mean of per-row scores: resample those, one pass over the rows
        per_row = whole if whole.ndim else np.array([gain(slice(i, i + 1)) for i in range(n)])
        samples = per_row[rng.integers(0, n, (ROUNDS, n))].mean(axis=1)
    else:
        began, found = time.perf_counter(), list[float]()
        while len(found) < ROUNDS and (len(found) < 100 or time.perf_counter() - began < BUDGET_S):
            found.append(gain(rng.integers(0, n, n)))
        samples = np.array(found)
    low, high = np.percentile(samples, [(100 - LEVEL) / 2, (100 + LEVEL) / 2])
    return Gap(float(np.mean(whole)), float(low), float(high), n)


class BestRows:
    """Validation truth and predictions at the best score so far."""

    def __init__(self, metric: Metric) -> None:
        self.metric = metric
        self.score: float | None = None
        self.rows: tuple[np.ndarray, np.ndarray] | None = None

    def watching(self) -> Metric:
        def fn(y_true: np.ndarray, y_pred: np.ndarray) -> float:
            score = self.metric(y_true, y_pred)
            if self.score is None or self.metric.better(score, self.score):
                self.score, self.rows = score, (y_true, y_pred)
            return score

        return replace(self.metric, fn=fn)


def trivial_baseline(metric: Metric, *, kind: str, train: np.ndarray, valid: np.ndarray) -> Baseline:
    """The task's constant answer, chosen on ``train`` and scored by ``metric`` on ``valid``, in target units."""
    train, valid = np.asarray(train), np.asarray(valid)
    if kind == "regression":
        value, what = _best_constant(metric, train.astype(np.float64))
    else:
        value = most_common(np.char.strip(train.astype(str)) if kind == "sequence" else train)
        what = f"the most common training {'target' if kind == 'sequence' else 'class'} {_short(value)}"
    constant = np.full(len(valid), value, dtype=object if kind != "regression" else np.float64)
    return Baseline(what, metric.name, metric.mode, metric(valid, constant), value)


def most_common(values: Any) -> Any:
    """The most frequent value, ties to the smallest, so 02's baseline and 03's blank stand-in agree."""
    found, counts = np.unique(np.asarray(values), return_counts=True)
    value = found[int(np.argmax(counts))]  # argmax: the first of the most frequent, in sorted order
    return value.item() if isinstance(value, np.generic) else value  # a plain number or text: run.json holds it


def _best_constant(metric: Metric, y: np.ndarray) -> tuple[float, str]:
    """The constant ``metric`` scores best on ``y``: the mean, every 2.5th percentile, then refined near the best."""
    judged = y if len(y) <= MAX_ROWS else np.random.default_rng(0).choice(y, MAX_ROWS, replace=False)
    median = float(np.median(judged))
    candidates = [float(np.mean(judged)), median, *np.quantile(judged, QUANTILES).tolist()]
    for _ in range(3):  # the grid, then the 1-D search twice around the best so far
        scores = [metric(judged, np.full(len(judged), c)) for c in candidates]
        best = candidates[int(np.argmax(scores) if metric.mode == "max" else np.argmin(scores))]
        grid = np.unique(candidates)
        at = int(np.searchsorted(grid, best))
        lower, upper = grid[max(at - 1, 0)], grid[min(at + 1, len(grid) - 1)]
        candidates = [best, *np.linspace(lower, upper, REFINE).tolist()]  # the best first: kept on a tie
    if best == float(np.mean(judged)):
        return best, f"the train mean {best:.4g}"
    if best == median:
        return best, f"the train median {best:.4g}"
    return best, f"the constant {best:.4g}, the train value {metric.name} scores best"


def _short(value: Any) -> str:
    text = str(value)
    return repr(text if len(text) <= 40 else text[:37] + "...")


def _signed(value: float) -> str:
    return ("+" if value >= 0 else "-") + figure(abs(value))
