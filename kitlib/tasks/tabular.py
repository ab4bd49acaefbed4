"""Tabular columns as model inputs, fitted on training rows and saved as JSON (log1p, standardise, rare -> 0)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from kitlib.data.tables import check_finite
from kitlib.errors import DataError, in_setup
from kitlib.tasks.targets import heavy_tailed

# lazy: pandas (+0.2 s): only fitting columns on a DataFrame needs it

if TYPE_CHECKING:
    import pandas as pd

MIN_CATEGORY_ROWS = 2  # a value seen once cannot be both learned and generalised: it joins "other" (id 0)


@dataclass(frozen=True)
class NumericColumn:
    name: str
    log: bool
    mean: float
    std: float


@dataclass(frozen=True)
class CategoricalColumn:
    name: str
    values: tuple[str, ...]  # id i + 1 for values[i]; everything else 0

    @property
    def cardinality(self) -> int:
        return len(self.values)


@dataclass(frozen=True)
class Columns:
    numeric: tuple[NumericColumn, ...]
    categorical: tuple[CategoricalColumn, ...]

    @property
    def n_numeric_inputs(self) -> int:
        return 2 * len(self.numeric)  # value and missing flag

    def transform(self, df: pd.DataFrame, *, path: Path | str) -> dict[str, np.ndarray]:
        """The model's ``numeric`` and ``categorical`` inputs for ``df``'s rows (only those with columns)."""
        out: dict[str, np.ndarray] = {}
        if self.numeric:
            parts = []
            for col in self.numeric:
                values = numeric_values(df, col.name, path)
                missing = np.isnan(values)
                x = np.log1p(np.clip(values, 0, None)) if col.log else values
                parts += [np.where(missing, 0.0, (x - col.mean) / col.std), missing.astype(np.float64)]
            out["numeric"] = np.stack(parts, axis=1).astype(np.float32)
        if self.categorical:
            ids = [
                _category_strings(df, col.name, path).map({v: i + 1 for i, v in enumerate(col.values)}).fillna(0)
                for col in self.categorical
            ]
            out["categorical"] = np.stack([s.to_numpy(dtype=np.int64) for s in ids], axis=1)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "numeric": [vars(c) for c in self.numeric],
            "categorical": [{"name": c.name, "values": list(c.values)} for c in self.categorical],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Columns:
        return cls(
            tuple(NumericColumn(**c) for c in d["numeric"]),
            tuple(CategoricalColumn(c["name"], tuple(c["values"])) for c in d["categorical"]),
        )


def fit_columns(train: pd.DataFrame, *, numeric: Sequence[str], categorical: Sequence[str], path: Path) -> Columns:
    """Statistics of the named columns over the training rows (a DataError naming the fix for a bad column)."""
    overlap = set(numeric) & set(categorical)
    if overlap:
        raise DataError(f"column {sorted(overlap)[0]!r} is in both numeric and categorical: keep it in one of them")
    nums = []
    for name in numeric:
        values = numeric_values(train, name, path)
        present = values[~np.isnan(values)]
        if len(present) == 0:
            raise DataError(f"{path}: numeric column {name!r} is empty in every row: drop it from numeric")
        log = bool(present.min() >= 0 and heavy_tailed(present))
        x = np.log1p(present) if log else present
        nums.append(NumericColumn(name, log, float(x.mean()), float(max(x.std(), 1e-6))))
    cats = []
    for name in categorical:
        counts = _category_strings(train, name, path).value_counts()
        kept = sorted(str(v) for v in counts[counts >= MIN_CATEGORY_ROWS].index)
        cats.append(CategoricalColumn(name, tuple(kept)))
    return Columns(tuple(nums), tuple(cats))


def numeric_values(df: pd.DataFrame, name: str, path: Path | str) -> np.ndarray:
    """float64 values of a numeric column (NaN where blank); text in it is a DataError naming the row and fix."""
    import pandas as pd

    _require(df, name, path, "numeric")
    col = df[name]
    values = pd.to_numeric(col, errors="coerce")
    bad = values.isna() & col.notna() & (col.astype(str).str.strip() != "")
    if bad.any():
        first = bad.idxmax()
        raise DataError(
            f"{path}: numeric column {name!r} holds text {col[first]!r} at row {first} ({int(bad.sum())} such rows). "
            f"Fix: clean those values (blanks are fine: they count as missing), or list {name!r} under categorical"
        )
    check_finite(values, path, name, "numeric")
    return values.to_numpy(dtype=np.float64)


def _category_strings(df: pd.DataFrame, name: str, path: Path | str) -> pd.Series:
    """The column's values as text whatever dtype pandas read (2001.0 from a column with blanks matches 2001)."""
    _require(df, name, path, "categorical")
    col = df[name]
    if col.dtype.kind == "f":
        whole = col.notna() & (col % 1 == 0)
        col = col.astype(object).where(~whole, col[whole].astype("int64").astype(object))
    return col.astype("string").fillna("").astype(str)  # blank and missing: one value, usually "other"


def _require(df: pd.DataFrame, name: str, path: Path | str, role: str) -> None:
    if name not in df.columns:
        raise DataError(
            f"{path}: no column {name!r} (listed in {role}); available columns: {list(df.columns)}. Fix: {role} "
            f"{in_setup(role)}"
        )
