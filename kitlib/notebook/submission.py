"""The submission file: checked against sample_submission.csv in 01, rechecked in 03, written atomically."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from kitlib._files import write_atomic
from kitlib.data.tables import check_unique_ids, read_table
from kitlib.errors import DataError

if TYPE_CHECKING:
    import pandas as pd

# lazy: pandas (+0.2 s): only checking a written submission needs it


def check_sample_submission(sample_path: Path, test_ids: Sequence[Any], *, id: str, target: str) -> tuple[str, ...]:
    """sample_submission.csv's columns, checked up front: it exists, has the id and target columns, test.csv's ids."""
    if not sample_path.is_file():
        raise DataError(f"no sample submission at {sample_path}: set sample_submission in the parameters cell")
    sample = read_table(sample_path, text=())  # empty, header-only and unparsable files: named, with the fix
    columns = tuple(str(c) for c in sample.columns)
    if set(columns) != {id, target}:
        raise DataError(
            f"{sample_path.name} has columns {list(columns)}, but the parameters say id={id!r}, target={target!r}: "
            "set id and target to the submission's column names"
        )
    check_unique_ids(sample, id, sample_path)
    sample_ids, ids = set(sample[id].astype(str)), {str(i) for i in test_ids}
    for missing, where, other in (
        (ids - sample_ids, sample_path.name, "test.csv"),
        (sample_ids - ids, "test.csv", sample_path.name),
    ):
        if missing:
            raise DataError(
                f"{len(missing)} ids of {other} are missing from {where}, e.g. {sorted(missing)[:3]}: the two files "
                "must list the same rows. Fix: use the competition's own pair (re-download both from the same "
                "release), or point test_file and sample_submission in 00's parameters cell at files that match"
            )
    return columns


def write_submission(
    submission: pd.DataFrame, columns: Sequence[str], n_rows: int, path: Path, sample: Path | None = None
) -> pd.DataFrame:
    """Check predictions as Kaggle's scorer would and write them atomically; returns the frame in the sample's order."""
    if set(submission.columns) != set(columns):
        raise DataError(f"submission columns {list(submission.columns)} != {list(columns)} of the sample submission")
    if len(submission) != n_rows:
        raise DataError(f"submission has {len(submission)} rows, the test set {n_rows}")
    if submission.isna().any().any():
        bad = submission.columns[submission.isna().any()].tolist()
        raise DataError(f"submission has missing values in {bad}: every row needs a prediction")
    if sample is not None and sample.is_file():
        _check_against_sample(submission, read_table(sample, text=()), sample.name)
    ordered = submission[list(columns)]
    if path.is_file():  # the last good submission stays one step back, never lost to a bad run
        write_atomic(path.with_name(f"{path.stem}.prev{path.suffix}"), path.read_bytes())
    # minimal quoting keeps the sample's look but quotes only the line terminator's '\n': a generated '\r' would split
    # its row when read back (pandas ends a line at either), so a submission holding one quotes every text
    texts = ordered.select_dtypes(exclude="number")  # a number holds no '\r': no str copy of a numeric column
    carriage = any(texts[c].astype(str).str.contains("\r", regex=False).any() for c in texts)
    write_atomic(path, ordered.to_csv(index=False, quoting=csv.QUOTE_NONNUMERIC if carriage else csv.QUOTE_MINIMAL))
    return ordered


def _check_against_sample(submission: pd.DataFrame, sample: pd.DataFrame, name: str) -> None:
    """Kaggle's "Submission Scoring Error" classes before writing: other ids, text for numbers, non-finite numbers."""
    import pandas as pd

    id_column = next((c for c in sample.columns if c in submission.columns), sample.columns[0])
    ours, theirs = set(submission[id_column].astype(str)), set(sample[id_column].astype(str))
    if ours != theirs:
        extra, missing = sorted(ours - theirs)[:3], sorted(theirs - ours)[:3]
        raise DataError(
            f"the submission's ids are not {name}'s (e.g. not in it: {extra}; missing: {missing}): Kaggle would not "
            "score it. Fix: predict the test.csv that came with this sample_submission.csv (re-run 01 on it)"
        )
    for column in sample.columns:
        values = submission[column]
        numbers = pd.to_numeric(values, errors="coerce")  # an object column of ints (decoded classes) is numbers
        if pd.api.types.is_numeric_dtype(sample[column]) and numbers.isna().any():
            raise DataError(
                f"the submission's {column!r} holds text, {name}'s numbers: Kaggle's scorer would fail. Fix: the "
                "target and task parameters (a class label where a number is scored?)"
            )
        if pd.api.types.is_numeric_dtype(values) and not np.isfinite(numbers.to_numpy(dtype=float)).all():
            raise DataError(f"the submission's {column!r} has inf values: every row needs a finite prediction")
