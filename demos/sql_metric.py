"""The SQL demo's metric, a user's metric file to kitlib: ``metric = "<folder>/sql_metric.py:record_f1"``.

Each row's record F1: both queries run read-only on the one SQLite file in ``data_dir`` (result rows as multisets),
timed and row-capped; a failing prediction scores 0, a failing reference raises a DataError naming its row. The demo
writer copies this file into the competition folder it makes, as a competition publishes its metric's code for the
user to download: kitlib loads it from its path (standard library, numpy and kitlib's errors only).
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from kitlib.errors import DataError, SetupError

TIMEOUT_S = 1.0  # per query, fetching included
MAX_ROWS = 100_000  # a result this large is no answer to a question about the data; refused before it fills memory
DATABASE_SUFFIXES = (".sqlite", ".sqlite3", ".db")  # the metric's database: the one such file in data_dir
_CHECK_EVERY = 1_000  # SQLite VM instructions between two clock checks (~tens of microseconds)
_FETCH = 1_000
_ROUND = 6

Rows = Counter[tuple[object, ...]]
Database = sqlite3.Connection | str | os.PathLike[str]

# Authorizer action codes a read-only query needs; everything else (INSERT, DROP, ATTACH, PRAGMA, ...) is denied.
_READ_ONLY = frozenset(
    {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, getattr(sqlite3, "SQLITE_RECURSIVE", 33)}
)


class QueryFailed(Exception):
    """A query could not give a result (SQLite error, denied, cut by the time limit, too many rows, no columns)."""


def record_f1(y_true: np.ndarray, y_pred: np.ndarray, *, data_dir: Path | None = None) -> np.ndarray:
    """Each row's record F1 of the generated query against the reference on data_dir's one SQLite file: kitlib
    scores their mean, and its verdict resamples these (one pass over the rows, not one per resample)."""
    return row_f1s(y_pred, y_true, database_in(data_dir))


def database_in(data_dir: Path | None) -> Path:
    """The one SQLite file in ``data_dir``; else a SetupError naming the fix."""
    found = sorted(f for f in data_dir.iterdir() if f.suffix in DATABASE_SUFFIXES) if data_dir is not None else []
    if len(found) != 1:
        where = f"data_dir ({data_dir}) holds {[f.name for f in found]}" if data_dir else "no data_dir was given"
        raise SetupError(
            f"metric 'record_f1' executes the generated SQL on the competition's database, but {where}: put exactly "
            f"one SQLite file ({', '.join(DATABASE_SUFFIXES)}) in data_dir"
        )
    return found[0]


def connect_readonly(path: str | os.PathLike[str]) -> sqlite3.Connection:
    """A read-only connection to an existing SQLite file (``mode=ro``: SQLite itself refuses every write)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"no SQLite database at {path}")
    # as_uri percent-encodes the path, so '?', '#' or '%' in a folder name cannot change the URI's meaning
    return sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False)


def _authorize(action: int, *_: object) -> int:
    return sqlite3.SQLITE_OK if action in _READ_ONLY else sqlite3.SQLITE_DENY


def _normalise(row: tuple[object, ...]) -> tuple[object, ...]:
    return tuple(round(v, _ROUND) if isinstance(v, float) else v for v in row)


def run_query(conn: sqlite3.Connection, sql: str, *, timeout: float = TIMEOUT_S, max_rows: int = MAX_ROWS) -> Rows:
    """The result rows of one read-only statement as a multiset; QueryFailed when it gives none."""
    if not isinstance(sql, str):
        raise QueryFailed(f"not a query string: {sql!r}")
    deadline = time.monotonic() + timeout
    conn.set_authorizer(_authorize)
    conn.set_progress_handler(lambda: time.monotonic() > deadline, _CHECK_EVERY)  # True aborts: 'interrupted'
    try:
        cursor = conn.execute(sql)  # one statement only: 'SELECT 1; DROP TABLE t' raises
        if cursor.description is None:  # '', a comment: no result columns, so not a query
            raise QueryFailed("the statement returns no columns")
        rows: Rows = Counter()
        while batch := cursor.fetchmany(_FETCH):
            rows.update(_normalise(row) for row in batch)
            if rows.total() > max_rows:
                raise QueryFailed(f"more than {max_rows} rows")
        return rows
    except (sqlite3.Error, sqlite3.Warning, ValueError, OverflowError) as err:  # ValueError: a NUL in the text
        raise QueryFailed(f"{type(err).__name__}: {err}") from err
    finally:
        conn.set_progress_handler(None, 0)
        conn.set_authorizer(None)


def rows_f1(predicted: Rows, gold: Rows) -> float:
    """Multiset F1 between two results; both empty -> 1.0."""
    if not predicted and not gold:
        return 1.0
    common = (predicted & gold).total()
    if common == 0:
        return 0.0
    precision, recall = common / predicted.total(), common / gold.total()
    return 2 * precision * recall / (precision + recall)


def _results(
    conn: sqlite3.Connection, queries: Iterable[str], timeout: float
) -> tuple[dict[str, Rows], dict[str, str]]:
    """Each distinct query run once: its rows, or why it gave none."""
    rows, failed = {}, {}
    for query in dict.fromkeys(queries):
        try:
            rows[query] = run_query(conn, query, timeout=timeout)
        except QueryFailed as err:
            failed[query] = str(err)
    return rows, failed


def row_f1s(
    predictions: Iterable[object], golds: Iterable[object], db: Database, *, timeout: float = TIMEOUT_S
) -> np.ndarray:
    """Each pair's record F1 on ``db`` (a connection, or a path opened read-only), each distinct query run once; a
    failing prediction scores 0, a failing reference raises a DataError naming its row and the fix."""
    preds, refs = [str(q) for q in predictions], [str(q) for q in golds]
    if len(preds) != len(refs):
        raise ValueError(f"{len(preds)} predictions for {len(refs)} gold queries")
    conn = db if isinstance(db, sqlite3.Connection) else connect_readonly(db)
    name = "the database" if isinstance(db, sqlite3.Connection) else Path(db).name
    try:
        try:
            run_query(conn, "SELECT count(*) FROM sqlite_master", timeout=timeout)
        except QueryFailed as err:
            raise DataError(
                f"the database {db} cannot be read ({err}). Fix: re-download it; record_f1 needs the "
                "competition's SQLite file in data_dir"
            ) from err
        gold, failed = _results(conn, refs, timeout)
        if failed:
            bad = [row for row, query in enumerate(refs) if query in failed]
            raise DataError(
                f"the reference query at row {bad[0]} fails on {name} ({failed[refs[bad[0]]]}): {refs[bad[0]]!r} "
                f"({len(bad)} such row(s)). record_f1 scores by the rows a reference returns: each must be "
                "read-only SQL that runs (no INSERT, UPDATE, DROP, ...). Fix: correct or drop those rows"
            )
        predicted = gold | _results(conn, [q for q in preds if q not in gold], timeout)[0]
    finally:
        if conn is not db:
            conn.close()
    pairs = zip(preds, refs, strict=True)
    return np.array([rows_f1(predicted[p], gold[g]) if p in predicted else 0.0 for p, g in pairs], dtype=np.float64)


def query_f1(predicted: str, gold: str, db: Database, *, timeout: float = TIMEOUT_S) -> float:
    """F1 between the rows ``predicted`` and ``gold`` return on ``db`` (a connection, or a path opened read-only)."""
    return float(row_f1s([predicted], [gold], db, timeout=timeout)[0])


def mean_record_f1(
    predictions: Sequence[str], golds: Sequence[str], db: Database, *, timeout: float = TIMEOUT_S
) -> float:
    """Mean record F1 over aligned predictions and gold queries, on one connection to ``db``."""
    scores = row_f1s(predictions, golds, db, timeout=timeout)
    if not len(scores):
        raise ValueError("no queries to score")
    return float(scores.mean())
