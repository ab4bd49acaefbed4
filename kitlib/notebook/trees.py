"""Gradient-boosted trees beside the head regime's network on small tables, blended on the validation rows."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

# lazy: sklearn (+14 s), threadpoolctl (+0.1 s): only a run with trees imports them

if TYPE_CHECKING:
    from kitlib.notebook.handoff import Features
    from kitlib.tasks.metrics import Metric

WEIGHTS = (0.0, 0.25, 0.5, 0.75, 1.0)  # the trees' share of a number's blend; classes: the network or the trees
EMBEDDING_DIMS = 16  # principal components of the text embeddings the trees split on (384 raw dims overfit 700 rows)
MAX_ROWS = 20_000  # training rows above which the network goes alone: trees are for the small tables
TREES_FILE = "trees.json"  # in run/: the blend weight 02 chose on validation (03 refits the trees when above 0)
# one OpenMP thread: libgomp spinning beside torch kept a 675-row fit over 5 min; one thread fits in ~1 s


def wanted(feats: Features) -> bool:
    """Whether a run gets trees: head regime, a class or number target, tabular columns, a small table."""
    return (
        feats.embeddings is not None
        and feats.spec.kind in ("regression", "binary", "multiclass")
        and bool(feats.side.train)
        and feats.n_train <= MAX_ROWS
    )


@dataclass
class Trees:
    model: Any  # a fitted HistGradientBoostingRegressor or -Classifier
    mean: np.ndarray  # the embeddings' training mean and principal axes, for the test rows' components
    axes: np.ndarray

    @classmethod
    def fit(cls, feats: Features, rows: np.ndarray, seed: int) -> Trees | None:
        """Trees on ``rows`` of the features, on the target as the network learns it; None without scikit-learn."""
        try:
            from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor
            from threadpoolctl import threadpool_limits
        except ImportError:
            print("trees: skipped, scikit-learn is not installed (pip install scikit-learn)")
            return None
        assert feats.embeddings is not None
        embedded = feats.embeddings[0][rows].astype(np.float64)
        mean = embedded.mean(0)
        axes = np.linalg.svd(embedded - mean, full_matrices=False)[2][:EMBEDDING_DIMS]  # deterministic: same rows
        trees = cls(None, mean, axes)
        x, categorical = trees.inputs(feats.embeddings[0][rows], {k: v[rows] for k, v in feats.side.train.items()})
        options = {"categorical_features": categorical, "random_state": seed, "max_iter": 300, "learning_rate": 0.05}
        if feats.spec.kind == "regression":
            loss = "absolute_error" if feats.spec.loss == "mae" else "squared_error"
            trees.model = HistGradientBoostingRegressor(loss=loss, **options)
        else:
            trees.model = HistGradientBoostingClassifier(**options)
        with threadpool_limits(1, user_api="openmp"):  # see ONE_THREAD
            trees.model.fit(x, feats.labels[rows])
        return trees

    def inputs(self, embeddings: np.ndarray, side: Any) -> tuple[np.ndarray, np.ndarray]:
        """The trees' columns: numeric inputs, category ids, embedding components; and which are categories."""
        none = np.zeros((len(embeddings), 0))
        numeric, ids = (np.asarray(side.get(k, none), np.float64) for k in ("numeric", "categorical"))
        components = (embeddings.astype(np.float64) - self.mean) @ self.axes.T
        categorical = np.repeat([False, True, False], [numeric.shape[1], ids.shape[1], components.shape[1]])
        return np.concatenate([numeric, ids, components], axis=1), categorical

    def predict(self, feats: Features, rows: np.ndarray | None) -> np.ndarray:
        """Predictions in the target's units for ``rows`` of the training features, or the test rows (None)."""
        from threadpoolctl import threadpool_limits

        assert feats.embeddings is not None
        if rows is None:
            x, _ = self.inputs(feats.embeddings[1], feats.side.test)
        else:
            x, _ = self.inputs(feats.embeddings[0][rows], {k: v[rows] for k, v in feats.side.train.items()})
        with threadpool_limits(1, user_api="openmp"):
            return feats.spec.decode(self.model.predict(x))


def mix(net: np.ndarray, trees: np.ndarray, weight: float, kind: str) -> np.ndarray:
    """The blend in the target's units: a weighted mean of numbers; for classes the trees' labels when chosen."""
    if kind == "regression":
        return (1.0 - weight) * np.asarray(net, np.float64) + weight * np.asarray(trees, np.float64)
    return trees if weight >= 0.5 else net


def blend(metric: Metric, y_true: np.ndarray, net: np.ndarray, trees: np.ndarray, kind: str) -> tuple[float, float]:
    """(trees' weight, score): the WEIGHTS value scoring best on the validation rows; ties keep the smaller."""
    weights = WEIGHTS if kind == "regression" else (0.0, 1.0)
    scores = [metric(y_true, mix(net, trees, w, kind)) for w in weights]
    best = functools.reduce(lambda b, i: i if metric.better(scores[i], scores[b]) else b, range(len(scores)), 0)
    return weights[best], scores[best]
