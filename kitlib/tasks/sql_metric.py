"""Text-to-SQL execution scoring: result rows as multisets, F1; read-only, timed, row-capped (failures score 0)."""

from __future__ import annotations

import os
import sqlite3
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

from kitlib.errors import DataError

TIMEOUT_S = 1.0  # per query, fetching included
MAX_ROWS = 100_000  # a result this large is no answer to a question about the data; refused before it fills memory
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


def _gold_rows(conn: sqlite3.Connection, gold: str, timeout: float) -> Rows:
    try:
        return run_query(conn, gold, timeout=timeout)
    except QueryFailed as err:
        raise DataError(
            f"a reference query fails ({err}): {gold!r}. Every reference (the training target's queries, or the "
            "solution's) must be read-only SQL that runs on the database. Fix: correct or drop that row"
        ) from err


def check_references(queries: pd.Series, database: Path, *, source: str, timeout: float = TIMEOUT_S) -> None:
    """Run each distinct query once read-only (cut at ``timeout`` s): a DataError naming the first failing row."""
    conn = connect_readonly(database)
    try:
        try:
            run_query(conn, "SELECT count(*) FROM sqlite_master", timeout=timeout)
        except QueryFailed as err:
            raise DataError(
                f"the database {database} cannot be read ({err}). Fix: re-download it; record_f1 needs the "
                "competition's SQLite file in data_dir"
            ) from err
        failed: dict[str, str] = {}
        for query in dict.fromkeys(str(q) for q in queries):
            try:
                run_query(conn, query, timeout=timeout)
            except QueryFailed as err:
                failed[query] = str(err)
    finally:
        conn.close()
    if failed:
        bad = queries.astype(str).isin(list(failed))
        row = bad.idxmax()
        query = str(queries[row])
        raise DataError(
            f"{source}: the reference query at row {row} fails on {database.name} ({failed[query]}): {query!r} "
            f"({int(bad.sum())} such row(s)). record_f1 scores by the rows a reference returns: each must be "
            "read-only SQL that runs (no INSERT, UPDATE, DROP, ...). Fix: correct or drop those rows"
        )


def _pair_f1(conn: sqlite3.Connection, predicted: str, gold: str, timeout: float) -> float:
    gold_rows = _gold_rows(conn, gold, timeout)  # first: a broken solution raises even when the prediction fails
    try:
        predicted_rows = run_query(conn, predicted, timeout=timeout)
    except QueryFailed:
        return 0.0
    return rows_f1(predicted_rows, gold_rows)


def _scoring(db: Database, predictions: Sequence[str], golds: Sequence[str], timeout: float) -> list[float]:
    if len(predictions) != len(golds):
        raise ValueError(f"{len(predictions)} predictions for {len(golds)} gold queries")
    conn = db if isinstance(db, sqlite3.Connection) else connect_readonly(db)
    try:
        return [_pair_f1(conn, p, g, timeout) for p, g in zip(predictions, golds, strict=True)]
    finally:
        if conn is not db:
            conn.close()


def record_f1(predicted: str, gold: str, db: Database, *, timeout: float = TIMEOUT_S) -> float:
    """F1 between the rows ``predicted`` and ``gold`` return on ``db`` (a connection, or a path opened read-only)."""
    return _scoring(db, [predicted], [gold], timeout)[0]


def mean_record_f1(
    predictions: Sequence[str], golds: Sequence[str], db: Database, *, timeout: float = TIMEOUT_S
) -> float:
    """Mean record F1 over aligned predictions and gold queries, on one connection to ``db``."""
    scores = _scoring(db, predictions, golds, timeout)
    if not scores:
        raise ValueError("no queries to score")
    return sum(scores) / len(scores)
