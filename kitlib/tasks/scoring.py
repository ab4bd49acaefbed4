"""Scoring a submission against held-out answers by id (``python -m kitlib score``) with any kitlib or user metric."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kitlib.data.tables import DataError
from kitlib.tasks.metrics import METRICS, get_metric

ABOUT_FILE = "demo.json"  # the demo's task, metric and the notebooks' parameters for it


def read_scored(
    path: str | Path, role: str, target: str = "label", *, text: bool = False, id: str = "id", blank: bool = True
) -> pd.DataFrame:
    """A solution or submission file (id as str, ``target``), or a DataError; text targets read verbatim, blanks ''."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"no {role} file at {path}")
    if path.stat().st_size == 0:
        raise DataError(f"the {role} file {path} is empty")
    # text: no 'NA'/'NULL' -> NaN guessing
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
    nan = df[target].isna() | (not blank and df[target].astype(str).str.strip() == "")
    if nan.any():
        first = int(nan.idxmax())
        raise DataError(
            f"the {role} file {path} has no {target} for id {df['id'][first]!r} (row {first}, "
            f"{int(nan.sum())} missing in all): predict every row"
        )
    return df


def read_matched(
    solution_csv: str | Path, submission_csv: str | Path, target: str = "label", **read: Any
) -> pd.DataFrame:
    """Solution and submission ``target`` matched by id: columns id, {target}_true, {target}_pred in solution order."""
    solution = read_scored(solution_csv, "solution", target, **read)
    check_same_ids(solution, submission := read_scored(submission_csv, "submission", target, **read))
    return solution.merge(submission, on="id", suffixes=("_true", "_pred"))


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
    """``metric`` of a submission against the solution matched by ``id``; mismatches raise a DataError with the fix."""
    kinds = METRICS[metric].kinds if metric in METRICS else frozenset({"binary", "regression"})
    texts = "sequence" in kinds  # else a blank cell is a missing prediction, not a label
    merged = read_matched(solution_csv, submission_csv, target, id=id, text=True, blank=texts)
    y_true, y_pred = merged[f"{target}_true"], merged[f"{target}_pred"]
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
