"""An offline, Kaggle-shaped demo competition for tabular-text regression: predict a film's box office (US dollars)
from a text description, numeric columns and categorical columns; scored by SMAPE (lower is better).

    paths = make_price_demo("demo-price")
    score_price(paths.solution, "submission.csv")   # SMAPE in percent, 0 (perfect) to 200
    median_baseline(paths)                          # what predicting the train median everywhere scores

The films (2,760 with a reported box office, 1940-2014) come from the Wikidata snapshot (CC0) that ships inside the
``bokeh-sampledata`` package (>= 2026.1; its ``movies.db``, read with sqlite3 and without importing the package).
Train and test are a random split of the films. ``solution.csv`` holds the held-out box office: only
``score_price`` reads it. The data is written to ``dir`` (keep it out of the repository).

Columns of train.csv (test.csv: the same without ``box_office``):

- ``id``; ``text``: title, genres, director(s), writer(s) and cast in one description;
- numeric (empty where the source has no value): ``year``, ``runtime`` (minutes), ``rt_reviews`` (Rotten Tomatoes
  review count), ``rt_meter`` (Tomatometer, %), ``rt_rating`` (critics' mean, 0-10), ``metacritic`` (0-100);
- categorical: ``mpaa`` (``Not Rated`` where none), ``genre``, ``language``, ``country``, ``studio`` (each the first
  one listed; ``Unknown`` where none);
- target ``box_office``: positive, heavy-tailed (median ~39 M, max ~2.8 G, a few implausibly small values kept as
  the source has them), which is why SMAPE, not RMSE, scores it.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd

from demos import DemoDataMissing, DemoPaths, write_competition
from kitlib.tasks.metrics import smape
from kitlib.tasks.scoring import score

PACKAGE = "bokeh_sampledata"  # import name; on PyPI: bokeh-sampledata
MIN_VERSION = (2026, 1)  # earlier releases carry a different, larger movies.db (OMDb-era, no such box-office column)
DB_FILE = "movies.db"
TARGET = "box_office"
NUMERIC = ("year", "runtime", "rt_reviews", "rt_meter", "rt_rating", "metacritic")
CATEGORICAL = ("mpaa", "genre", "language", "country", "studio")
INSTALL = "pip install --no-deps 'bokeh-sampledata>=2026.1'"
PARAMETERS = {  # 00_setup's parameters for this competition (demo.json; `notebooks run --params DIR/demo.json`)
    "task": "tabular-text",
    "metric": "smape",
    "target": TARGET,
    "numeric": list(NUMERIC),
    "categorical": list(CATEGORICAL),
}

_QUERY = """
SELECT o.ID, o.Title, o.Year, o.Runtime, o.Genre, o.Director, o.Writer, o.Cast, o.Metacritic, o.Rating AS mpaa,
       o.Language, o.Country, t.Reviews, t.Meter, t.Rating AS rt_rating, t.Production, t.BoxOffice
FROM omdb AS o JOIN tomatoes AS t ON o.ID = t.ID
WHERE t.BoxOffice > 0
ORDER BY o.ID
"""


def movies_db_path() -> Path:
    """``movies.db`` inside the installed bokeh-sampledata package, located without importing it."""
    spec = importlib.util.find_spec(PACKAGE)
    path = Path(spec.origin).parent / "_data" / DB_FILE if spec is not None and spec.origin else None
    if path is None or not path.is_file():
        raise DemoDataMissing(
            f"the price demo's films ({DB_FILE}) come with the bokeh-sampledata package, which is not installed: "
            f"{INSTALL}"
        )
    try:
        version = importlib.metadata.version("bokeh-sampledata")
    except importlib.metadata.PackageNotFoundError:  # files without metadata (a vendored copy): trust them
        return path
    parts = tuple(int(p) if p.isdigit() else 0 for p in version.split(".")[:2])
    if parts < MIN_VERSION:
        raise DemoDataMissing(
            f"bokeh-sampledata {version} carries an older {DB_FILE} than the price demo reads (2026.1 or later): "
            f"{INSTALL.replace('--no-deps', '--no-deps --upgrade')}"
        )
    return path


def _first(listed: pd.Series, missing: str = "Unknown") -> pd.Series:
    """The first entry of a comma-separated list ('Comedy, Drama' -> 'Comedy'); ``missing`` where there is none."""
    first = listed.fillna("").astype(str).str.split(",").str[0].str.strip()
    return first.where(first != "", missing)


def _describe(films: pd.DataFrame) -> pd.Series:
    """'Title (genres). Directed by ... Written by ... Starring ...', leaving out the parts the source lacks."""

    def one(row: pd.Series) -> str:
        genres = str(row["Genre"] or "").strip()
        parts = [f"{row['Title']} ({genres})." if genres else f"{row['Title']}."]
        for label, column in (("Directed by", "Director"), ("Written by", "Writer"), ("Starring", "Cast")):
            value = row[column]
            if isinstance(value, str) and value.strip():
                parts.append(f"{label} {value.strip()}.")
        return " ".join(parts)

    return films.apply(one, axis=1)


def load_films() -> pd.DataFrame:
    """Every film with a positive box office, in source order: columns text, the NUMERIC and CATEGORICAL ones,
    box_office."""
    uri = f"{movies_db_path().as_uri()}?mode=ro&immutable=1"  # never writes next to the installed file
    try:
        with contextlib.closing(sqlite3.connect(uri, uri=True)) as con:
            raw = pd.read_sql_query(_QUERY, con)
    except (sqlite3.Error, pd.errors.DatabaseError) as err:
        raise DemoDataMissing(f"cannot read the films from {DB_FILE} ({err}): reinstall it: {INSTALL}") from err
    return pd.DataFrame(
        {
            "text": _describe(raw),
            "year": raw["Year"].astype("Int64"),
            "runtime": pd.to_numeric(raw["Runtime"], errors="coerce"),
            "rt_reviews": pd.to_numeric(raw["Reviews"], errors="coerce").astype("Int64"),
            "rt_meter": pd.to_numeric(raw["Meter"], errors="coerce").astype("Int64"),
            "rt_rating": pd.to_numeric(raw["rt_rating"], errors="coerce"),
            "metacritic": pd.to_numeric(raw["Metacritic"], errors="coerce").astype("Int64"),
            "mpaa": raw["mpaa"].fillna("").str.strip().replace("", "Not Rated"),
            "genre": _first(raw["Genre"]),
            "language": _first(raw["Language"]),
            "country": _first(raw["Country"]),
            "studio": _first(raw["Production"]),
            TARGET: raw["BoxOffice"].astype(float),
        }
    )


def make_price_demo(dir: str | Path, *, seed: int = 0, test_fraction: float = 0.2, force: bool = False) -> DemoPaths:
    """Write train.csv, test.csv, sample_submission.csv (every row: the train median) and solution.csv into ``dir``
    (< 1 s; deterministic for ``seed``). ``force``: as for ``make_demo``, a folder holding files the demo did not
    write is refused unless ``force=True``."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    films = load_films()
    n = len(films)
    test = np.zeros(n, dtype=bool)
    test[np.random.default_rng(seed).permutation(n)[: round(test_fraction * n)]] = True
    # Random ids over all rows, files sorted by id: neither the order nor the ids reveal the source order or split.
    films = films.assign(id=np.random.default_rng([seed, 1]).permutation(n))
    features = ["id", "text", *NUMERIC, *CATEGORICAL]
    train_rows, test_rows = films[~test].sort_values("id"), films[test].sort_values("id")
    median = float(train_rows[TARGET].median())
    return write_competition(
        dir,
        train=train_rows[[*features, TARGET]],
        test=test_rows[features],
        sample_submission=test_rows[["id"]].assign(**{TARGET: median}),
        solution=test_rows[["id", TARGET]],
        force=force,
        about={"task": "tabular-text", "metric": "smape", "parameters": PARAMETERS},
    )


def _smape(y_true: np.ndarray | list[float], y_pred: np.ndarray | list[float]) -> float:
    """kitlib.tasks.metrics.smape (percent, 0-200, 0/0 counting 0) of two equal, non-empty 1-d arrays."""
    actual, forecast = np.asarray(y_true, dtype=float), np.asarray(y_pred, dtype=float)
    if actual.shape != forecast.shape or actual.ndim != 1 or actual.size == 0:
        raise ValueError(f"SMAPE needs two equal, non-empty 1-d arrays; got shapes {actual.shape}, {forecast.shape}")
    return smape(actual, forecast)


def score_price(solution_csv: str | Path, submission_csv: str | Path) -> float:
    """SMAPE (percent, lower is better) of a submission against the held-out solution, matched by id
    (kitlib.tasks.scoring.score: mismatched ids, row counts, missing or non-numeric predictions raise a DataError)."""
    return score(solution_csv, submission_csv, target=TARGET, metric="smape")


def median_baseline(paths: DemoPaths) -> float:
    """SMAPE of the trivial submission: the train median box office for every test film (what sample_submission.csv
    holds). Any model worth keeping scores below it."""
    median = float(pd.read_csv(paths.train, usecols=[TARGET])[TARGET].median())
    solution = pd.read_csv(paths.solution)
    return _smape(solution[TARGET].to_numpy(dtype=float), np.full(len(solution), median))
