"""Demo competitions cut to a test's size. Not a test module."""

from __future__ import annotations

from pathlib import Path

import pandas as pd


def cut_demo(data: Path, rows: int) -> None:
    """The demo's first ``rows`` training rows and ``rows // 4`` test rows; its submission files keep the same ids.
    A route is under test, not the demo's size: the reviews demo whole (10,227 rows) costs minutes a run at smoke."""
    pd.read_csv(data / "train.csv").head(rows).to_csv(data / "train.csv", index=False)
    test = pd.read_csv(data / "test.csv").head(rows // 4)
    test.to_csv(data / "test.csv", index=False)
    for name in ("sample_submission.csv", "solution.csv"):
        table = pd.read_csv(data / name)
        table[table["id"].isin(test["id"])].to_csv(data / name, index=False)
