"""Read a competition table, check it before work is spent, read its target (a TargetSpec); one ``DataError`` each."""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from kitlib.errors import DataError, in_setup

# lazy: pandas (+0.2 s): the CLI and parameter checks need only names here

if TYPE_CHECKING:
    import pandas as pd

    from kitlib.config import TargetRule

TargetKind = Literal["binary", "multiclass", "regression", "sequence"]  # sequence: a text to generate (seq2seq)

MAX_INT_CLASSES = 20  # integer targets with at most this many distinct values are classes (ratings 1-5, ids 0-9)
# a larger text cell is an export accident: tokenizing costs ~100x its size in memory
MAX_TEXT_CHARS = 1_000_000


def _row(index: Any) -> str:
    """Human position of a data row: its label, and its line in a CSV with a header (1-based)."""
    if isinstance(index, (int, np.integer)):
        return f"row {index} (line {int(index) + 2} of the file)"
    return f"row {index!r}"


def _py(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def _value(value: Any) -> str:
    return repr(_py(value))


def _rows(count: int) -> str:
    return f"{count} such row{'' if count == 1 else 's'} in all"


def _json_row(line: str, path: Path, n: int) -> dict[str, Any]:
    """One JSONL line as a row; a chat's ``messages`` become ``prompt`` (JSON turns) and ``response`` (last reply)."""

    try:
        row = json.loads(line)
        if not isinstance(row, dict):
            raise ValueError(f"a JSON {type(row).__name__}, not an object")
        turns = row.pop("messages", None)
        if turns is None:
            return row
        if not isinstance(turns, list) or not all(
            isinstance(t, dict) and {"role", "content"} <= t.keys() for t in turns
        ):
            raise ValueError("messages must be a list of {'role': ..., 'content': ...} turns")
    except ValueError as err:
        raise DataError(f"{path}, line {n}: {err}. Fix: repair or drop that line (one JSON object a line)") from err
    last = turns[-1]["role"] == "assistant" if turns else False
    return (
        row
        | {"prompt": json.dumps(turns[:-1] if last else turns)}
        | ({"response": turns[-1]["content"]} if last else {})
    )


def _read(path: Path) -> pd.DataFrame:
    import pandas as pd  # deferred: `import kitlib.data.tables` stays light

    suffixes = "".join(path.suffixes[-2:]).lower()
    if ".parquet" in suffixes:
        return pd.read_parquet(path)
    if ".jsonl" in suffixes:
        return pd.DataFrame([_json_row(line, path, n) for n, line in enumerate(path.open(encoding="utf-8"), 1)
                             if line.strip()])  # fmt: skip
    sep = "\t" if ".tsv" in suffixes else ","
    return pd.read_csv(path, sep=sep)  # compression (.gz, .bz2, .zip, .xz) is inferred from the suffix


def read_table(
    path: str | Path,
    *,
    text: str | Sequence[str] = "text",
    target: str | None = None,
    id: str | None = None,
    rule: TargetRule = "auto",
) -> pd.DataFrame:
    """Read a CSV/TSV/Parquet/JSONL table and check the columns kitlib uses (rows, columns, text, ids, target)."""
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        parent = path.parent if path.parent.is_dir() else None
        nearby = sorted(p.name for p in parent.iterdir())[:10] if parent is not None else []
        hint = f"; files in {parent}: {nearby}" if parent is not None else f"; {path.parent} does not exist either"
        raise DataError(
            f"no file at {path}{hint}. Fix: point to the file (in a notebook: data_dir, train_file or test_file in "
            "the parameters cell); on Kaggle, inputs are under /kaggle/input/<slug>/"
        )
    if path.stat().st_size == 0:
        raise DataError(f"{path} is empty (0 bytes): re-download or re-export it")
    try:
        df = _read(path)
    except DataError:  # already names the line and the fix
        raise
    except pd.errors.EmptyDataError as err:
        raise DataError(f"{path} has no columns or rows ({err}): re-download or re-export it") from err
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as err:
        raise DataError(f"{path} could not be parsed ({err}): check the delimiter and encoding (UTF-8)") from err
    if len(df) == 0:
        raise DataError(f"{path} has a header ({list(df.columns)}) but no data rows: re-download or re-export it")

    texts = [text] if isinstance(text, str) else list(text)
    wanted = [*texts, *([target] if target else []), *([id] if id else [])]
    missing = [c for c in wanted if c not in df.columns]
    if missing:
        role = "text" if missing[0] in texts else "target" if missing[0] == target else "id"
        raise DataError(
            f"{path}: no column {missing[0]!r} (the {role} column); available columns: {list(df.columns)}. "
            f"Set {role}=<one of those> (in a notebook: its parameters cell; in Python: read_table's {role}=)."
        )
    for col in texts:
        df[col] = _check_text(df[col], path, col)
    if id is not None:
        check_unique_ids(df, id, path)
    if target is not None:
        _check_target(df[target], path, target, rule)
    return df


def check_unique_ids(df: pd.DataFrame, id: str, path: Path) -> None:
    dup = df[id].duplicated()
    if dup.any():
        first = dup.idxmax()
        raise DataError(
            f"{path}: id column {id!r} repeats {_value(df[id][first])} at {_row(first)}; ids must be unique: drop or "
            "renumber the repeated rows"
        )


def _check_text(col: pd.Series, path: Path, name: str) -> pd.Series:
    # A blank cell is the empty text '' (CSV cannot tell it from missing; test rows cannot be dropped)
    missing = col.isna()
    if missing.any():
        first = missing.idxmax()
        warnings.warn(
            f"{path}: text column {name!r} is blank at {_row(first)} ({_rows(int(missing.sum()))}): kitlib reads "
            "each as the empty text ''",
            stacklevel=3,
        )
        col = col.where(~missing, "")
    not_str = ~col.map(lambda v: isinstance(v, str)).astype(bool)
    if not_str.any():
        first = not_str.idxmax()
        raise DataError(
            f"{path}: text column {name!r} holds {type(_py(col[first])).__name__} {_value(col[first])} at "
            f"{_row(first)}, not text (column dtype {col.dtype}). Is {name!r} the right column? "
            f"To use numbers as text: df[{name!r}] = df[{name!r}].astype(str)."
        )
    sizes = col.str.len()
    huge = sizes > MAX_TEXT_CHARS
    if huge.any():
        first = sizes.idxmax()
        raise DataError(
            f"{path}: text column {name!r} holds {int(sizes[first]):,} characters at {_row(first)} "
            f"({_rows(int(huge.sum()))} over {MAX_TEXT_CHARS:,}): tokenizing it would take ~100x that in memory, and "
            f"the model reads only its first few thousand tokens. Fix: cut the cells, e.g. "
            f"df[{name!r}] = df[{name!r}].str.slice(0, 100_000), or drop those rows"
        )
    return col.astype(str)


def _check_target(col: pd.Series, path: Path | str, name: str, rule: TargetRule) -> None:
    import pandas as pd

    missing = col.isna()
    if missing.any():
        first = missing.idxmax()
        raise DataError(
            f"{path}: target column {name!r} is missing at {_row(first)} ({_rows(int(missing.sum()))}). "
            f"Fix: drop them (df = df.dropna(subset=[{name!r}])) or fill them."
        )
    if col.dtype.kind == "f":
        check_finite(col, path, name, "target")
    if col.dtype.kind in "biuf" or rule == "classify":
        return
    numeric = pd.to_numeric(col, errors="coerce")
    bad = numeric.isna()
    # All class names ('fresh'/'rotten') is classification; some numbers and some not is a dirty numeric column.
    if rule == "regress" or not bad.all():
        first = bad.idxmax()
        raise DataError(
            f"{path}: target column {name!r} is not numeric at {_row(first)}: {_value(col[first])}. Fix the value, "
            "or set task='classify' (the parameters cell; read_table(rule='classify') in Python) if the column holds "
            "class names."
        )


def check_finite(values: pd.Series, path: Path | str, name: str, role: str) -> None:
    """inf or -inf in a number column: training would stop on a non-finite loss steps later, naming no row."""
    bad = np.isinf(values.to_numpy(dtype=np.float64))
    if bad.any():
        first = values.index[int(np.argmax(bad))]
        raise DataError(
            f"{path}: {role} column {name!r} holds {_value(values[first])} at {_row(first)} ({_rows(int(bad.sum()))}): "
            f"a number must be finite. Fix: correct those values, or drop them "
            f"(df = df[np.isfinite(df[{name!r}])]) or blank them (missing)"
        )


@dataclass(frozen=True)
class TargetSpec:
    kind: TargetKind
    num_labels: int  # model outputs: classes, or 1 for regression
    classes: tuple[Any, ...] = ()  # original label of each code 0..k-1; empty for regression
    # Regression learns ((log1p(y) if log else y) - center) / scale: O(1) MSE gradients; the log for heavy tails
    log: bool = False
    center: float = 0.0
    scale: float = 1.0
    loss: str = "mse"  # regression: "mse" (squared error: the mean) or "mae" (absolute error: the median), on the above

    def encode(self, values: pd.Series | Sequence[Any]) -> np.ndarray:
        """Labels -> int64 codes (classification) or float32 targets (regression, transformed as the spec says)."""
        import pandas as pd

        series = pd.Series(values)
        if self.kind == "regression":
            y = series.to_numpy(dtype=np.float64)
            return (((np.log1p(y) if self.log else y) - self.center) / self.scale).astype(np.float32)
        mapping = {c: i for i, c in enumerate(self.classes)}
        codes = series.map(mapping)
        if codes.isna().any():
            first = codes.isna().idxmax()
            raise DataError(
                f"label {_value(series[first])} at {_row(first)} is not one of the classes {list(self.classes)}"
            )
        return codes.to_numpy(dtype=np.int64)

    def decode(self, codes: Sequence[int] | np.ndarray) -> np.ndarray:
        """Codes -> original labels; model outputs -> values in the target's units (regression)."""
        if self.kind == "regression":
            y = np.asarray(codes, dtype=np.float64) * self.scale + self.center
            return np.expm1(y) if self.log else y
        return np.asarray(self.classes, dtype=object)[np.asarray(codes, dtype=np.int64)]

    def to_dict(self) -> dict[str, Any]:
        classes = [c.item() if isinstance(c, np.generic) else c for c in self.classes]  # JSON-safe
        transform = {"log": self.log, "center": self.center, "scale": self.scale, "loss": self.loss}
        transform = transform if self.kind == "regression" else {}
        return {"kind": self.kind, "num_labels": self.num_labels, "classes": classes, **transform}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TargetSpec:
        transform = {k: d[k] for k in ("log", "center", "scale", "loss") if k in d}
        return cls(d["kind"], int(d["num_labels"]), tuple(d["classes"]), **transform)


def texts_to_generate(series: pd.Series) -> bool:
    """Whether a target holds texts to generate: text values, > MAX_INT_CLASSES distinct, mostly unique per row."""
    k = int(series.nunique(dropna=False))
    return series.dtype.kind not in "biuf" and k > MAX_INT_CLASSES and 2 * k > len(series)


def infer_target(series: pd.Series, rule: TargetRule = "auto") -> TargetSpec:
    """Binary / multi-class / regression from a target column; class names or sparse ids get codes 0..k-1."""
    import pandas as pd

    name = series.name if series.name is not None else "target"
    _check_target(series, "target", str(name), rule)
    is_int_valued = series.dtype.kind in "biu" or (
        series.dtype.kind == "f" and bool(np.all(np.mod(series.to_numpy(dtype=np.float64), 1) == 0))
    )
    uniques = pd.unique(series)
    if rule == "regress":
        return TargetSpec("regression", 1)
    if rule == "auto" and series.dtype.kind in "iuf":
        if not is_int_valued:
            return TargetSpec("regression", 1)  # fractions: a quantity
        k, n = len(uniques), len(series)
        if k > MAX_INT_CLASSES and 2 * k > n:
            return TargetSpec("regression", 1)  # most rows have their own value: a count or price, not class ids
        if k > MAX_INT_CLASSES:  # e.g. 50 category codes over 500 rows, or a 0-100 score: both are plausible
            raise DataError(
                f"target column {name!r} holds {k} distinct whole numbers over {n} rows (~{n / k:.0f} rows each): "
                "class ids or a quantity? kitlib will not guess. Fix: set task = 'classify' (category codes: the "
                f"submission holds the same integers) or task = 'regress' (a number: predicted as decimals) "
                f"{in_setup('task', env=True)}"
            )
    classes = tuple(sorted(uniques.tolist() if hasattr(uniques, "tolist") else list(uniques)))
    k, n = len(classes), len(series)
    if rule == "auto" and texts_to_generate(series):
        example = max(classes, key=lambda c: len(str(c)))
        raise DataError(
            f"target column {name!r} holds {k} distinct texts over {n} rows (e.g. {str(example)[:80]!r}): most rows "
            "have a label of their own: texts to generate, not classes. kitlib will not guess. Fix: set task "
            f"{in_setup('task', env=True)}: "
            "task = 'seq2seq' (a text column -> this text), 'custom-seq2seq' (the same with your own "
            "encoder-decoder) or 'causal-lm' (a prompt -> this response) to generate them, or task = 'classify' if "
            "these really are class names"
        )
    if len(classes) < 2:
        raise DataError(
            f"target column {name!r} has a single value ({classes[0]!r}) in every row: there is nothing to learn. Fix: "
            "check that target names the label column and that the file holds all the training rows"
        )
    return TargetSpec("binary" if len(classes) == 2 else "multiclass", len(classes), classes)
