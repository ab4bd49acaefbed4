from __future__ import annotations

import hashlib
import re
import sqlite3
import string
import time
from pathlib import Path

import pandas as pd
import pytest

from demos.sql import (
    DB_FILE,
    SCHEMA,
    TEMPLATES,
    SqlDemoPaths,
    baseline_f1,
    make_sql_demo,
    most_common_query,
    parameters,
    score_sql,
)
from demos.sql_metric import TIMEOUT_S, QueryFailed, connect_readonly, mean_record_f1, query_f1, run_query
from kitlib.errors import DataError

FILES = ("train", "test", "sample_submission", "solution", "db")


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> SqlDemoPaths:
    return make_sql_demo(tmp_path_factory.mktemp("sqldemo"), seed=0)


@pytest.fixture(scope="module")
def by_values(tmp_path_factory: pytest.TempPathFactory) -> SqlDemoPaths:
    return make_sql_demo(tmp_path_factory.mktemp("sqldemo-values"), seed=0, split="values")


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_files_columns_and_sizes(demo: SqlDemoPaths) -> None:
    train, test = pd.read_csv(demo.train), pd.read_csv(demo.test)
    sample, solution = pd.read_csv(demo.sample_submission), pd.read_csv(demo.solution)
    assert list(train.columns) == ["id", "question", "query"]
    assert list(test.columns) == ["id", "question"]
    assert list(sample.columns) == list(solution.columns) == ["id", "query"]
    assert (len(train), len(test)) == (1500, 300)
    assert test["id"].tolist() == solution["id"].tolist() == sample["id"].tolist()
    assert not set(train["id"]) & set(test["id"])
    assert train["question"].nunique() > 0.97 * len(train) and test["question"].is_unique
    assert demo.db == demo.root / DB_FILE
    with connect_readonly(demo.db) as conn:
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        counts = {t: conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in sorted(tables)}
    conn.close()
    assert counts == {"customers": 300, "orders": 3000, "products": 60}


def test_templates_are_consistent() -> None:
    assert 15 <= len(TEMPLATES) <= 30 and len({t.name for t in TEMPLATES}) == len(TEMPLATES)
    for template in TEMPLATES:
        assert template.slots, f"{template.name}: a template without slots cannot be split by value"
        assert len(template.questions) >= 3, template.name
        for question in template.questions:
            fields = {f for _, f, _, _ in string.Formatter().parse(question) if f}
            assert fields == set(template.slots), (template.name, question)
    with sqlite3.connect(":memory:") as conn:
        conn.executescript(SCHEMA)  # the schema the templates are written against is valid SQL


def test_every_template_is_used_in_both_splits(by_values: SqlDemoPaths, demo: SqlDemoPaths) -> None:
    patterns = {}
    for template in TEMPLATES:
        pattern = re.escape(template.sql)
        for slot in template.slots:
            pattern = pattern.replace(re.escape("{" + slot + "}"), ".+?")
        patterns[template.name] = re.compile(pattern)

    def template_of(query: str) -> str:
        names = [name for name, pattern in patterns.items() if pattern.fullmatch(query)]
        assert len(names) == 1, (query, names)
        return names[0]

    train = pd.read_csv(by_values.train)["query"].map(template_of).value_counts()
    test = pd.read_csv(by_values.solution)["query"].map(template_of).value_counts()
    assert set(train.index) == set(test.index) == {t.name for t in TEMPLATES}
    assert train.min() >= 1500 // len(TEMPLATES) and test.min() >= 300 // len(TEMPLATES)
    # split="questions": a template whose every question was asked in train (few slot values) sits out of test
    train = pd.read_csv(demo.train)["query"].map(template_of).value_counts()
    test = pd.read_csv(demo.solution)["query"].map(template_of).value_counts()
    assert set(train.index) == {t.name for t in TEMPLATES} and len(test) >= len(TEMPLATES) - 4


def test_every_gold_query_executes_and_answers(demo: SqlDemoPaths) -> None:
    golds = pd.concat([pd.read_csv(demo.train)["query"], pd.read_csv(demo.solution)["query"]])
    conn = connect_readonly(demo.db)
    try:
        for query in golds:
            rows = run_query(conn, query)
            assert any(v is not None for row in rows for v in row), query
    finally:
        conn.close()


def test_no_test_question_is_asked_in_train(demo: SqlDemoPaths) -> None:
    train, test = pd.read_csv(demo.train), pd.read_csv(demo.test)
    solution = pd.read_csv(demo.solution)
    assert len(test) == 300 and not set(test["question"]) & set(train["question"])
    assert not set(solution["query"]) & set(train["query"])  # no answer learned by heart: new combinations


def test_split_is_by_slot_value(by_values: SqlDemoPaths) -> None:
    train, solution = pd.read_csv(by_values.train), pd.read_csv(by_values.solution)
    test = pd.read_csv(by_values.test)
    assert not set(test["question"]) & set(train["question"])
    assert not set(solution["query"]) & set(train["query"])
    # the text slots' values in the SQL: no city, country, category, product or customer is on both sides
    pattern = re.compile(r"\b(city|country|category|name|status) = '((?:[^']|'')*)'")
    for column in ("city", "country", "category", "name", "status"):
        seen = [{v for q in df["query"] for c, v in pattern.findall(q) if c == column} for df in (train, solution)]
        assert seen[0] and seen[1] and not seen[0] & seen[1], column


def test_deterministic_for_a_seed(demo: SqlDemoPaths, tmp_path: Path) -> None:
    again = make_sql_demo(tmp_path / "a", seed=0)
    for name in FILES:
        assert _sha(getattr(again, name)) == _sha(getattr(demo, name)), name
    other = make_sql_demo(tmp_path / "b", seed=1, n_train=200, n_test=40)
    assert _sha(other.db) != _sha(demo.db)
    assert len(pd.read_csv(other.train)) == 200 and len(pd.read_csv(other.test)) == 40
    assert not list((tmp_path / "a").glob(".*.tmp"))  # atomic writes leave no temp files


def test_never_overwrites_a_users_own_files(tmp_path: Path) -> None:
    mine = tmp_path / "comp"
    mine.mkdir()
    (mine / "train.csv").write_text("id,question,query\n1,mine,SELECT 1\n")
    with pytest.raises(DataError, match=r"already holds train.csv, not written by .*--force"):
        make_sql_demo(mine, n_train=50, n_test=10)
    assert (mine / "train.csv").read_text() == "id,question,query\n1,mine,SELECT 1\n"
    assert not (mine / DB_FILE).exists()
    make_sql_demo(mine, n_train=50, n_test=10, force=True)  # asked for
    make_sql_demo(mine, n_train=50, n_test=10)  # a folder the demo wrote is the demo's to rewrite


# --- the metric


@pytest.fixture
def db(demo: SqlDemoPaths) -> Path:
    return demo.db


def test_record_f1_known_cases(db: Path) -> None:
    products = "SELECT product_id FROM products WHERE product_id <= 4"
    assert query_f1(products, products, db) == 1.0
    reversed_order = "SELECT product_id FROM products WHERE product_id <= 4 ORDER BY product_id DESC"
    assert query_f1(reversed_order, products, db) == 1.0  # order-insensitive
    assert query_f1("SELECT name FROM customers", "SELECT name FROM products", db) == 0.0
    # partial overlap: {3, 4, 5} vs {1, 2, 3, 4}: P = 2/3, R = 2/4, F1 = 4/7
    assert query_f1("SELECT product_id FROM products WHERE product_id IN (3, 4, 5)", products, db) == pytest.approx(
        4 / 7
    )
    assert query_f1("SELECT 1 UNION ALL SELECT 1", "SELECT 1", db) == pytest.approx(2 / 3)  # multisets: P 1/2, R 1
    assert query_f1("SELECT 0.1 + 0.2", "SELECT 0.3", db) == 1.0  # floats compared at 6 decimals
    assert query_f1("SELECT 3", "SELECT 3.0", db) == 1.0
    assert query_f1("SELECT name, price FROM products", "SELECT price, name FROM products", db) == 0.0
    for failing in ("SELEC name FROM products", "SELECT nope FROM products", "SELECT * FROM nope", "", "-- only"):
        assert query_f1(failing, products, db) == 0.0, failing
    empty = "SELECT name FROM products WHERE price < 0"
    assert query_f1(empty, "SELECT name FROM customers WHERE 0", db) == 1.0  # both empty
    assert query_f1(empty, products, db) == 0.0
    assert query_f1(products, empty, db) == 0.0


def test_a_failing_gold_query_raises(db: Path) -> None:
    with pytest.raises(
        DataError, match=r"reference query at row 0 fails .*'SELECT \* FROM nope'.*Fix: correct or drop"
    ):
        query_f1("SELECT 1", "SELECT * FROM nope", db)
    with pytest.raises(ValueError, match="2 predictions for 1 gold"):
        mean_record_f1(["SELECT 1", "SELECT 1"], ["SELECT 1"], db)


@pytest.mark.parametrize(
    "attack",
    [
        "DROP TABLE orders",
        "DELETE FROM orders",
        "UPDATE products SET price = 0",
        "SELECT 1; DROP TABLE orders",
        "ATTACH DATABASE 'attached.sqlite' AS other",
        "PRAGMA writable_schema = ON",
        "VACUUM",
    ],
)
def test_predictions_never_write(
    demo: SqlDemoPaths, tmp_path: Path, attack: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # where an ATTACH would create its file
    before = _sha(demo.db)
    gold = "SELECT COUNT(*) FROM orders"
    assert query_f1(attack, gold, demo.db) == 0.0  # a path: opened read-only
    writable = sqlite3.connect(demo.db)  # even a writable connection handed in: the authorizer denies writes
    try:
        assert query_f1(attack, gold, writable) == 0.0
        assert writable.execute(gold).fetchone() == (3000,)
    finally:
        writable.close()
    assert _sha(demo.db) == before
    assert not list(tmp_path.iterdir())


def test_a_runaway_query_is_cut_by_the_time_limit(db: Path) -> None:
    assert TIMEOUT_S == 1.0
    endless = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT max(x) FROM c"
    start = time.perf_counter()
    assert query_f1(endless, "SELECT 1", db, timeout=0.2) == 0.0
    assert time.perf_counter() - start < 10.0  # cut (an endless query never returns), with room for a busy machine
    rows = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c"  # endless rows
    conn = connect_readonly(db)
    try:
        with pytest.raises(QueryFailed, match="more than 1000 rows"):
            run_query(conn, rows, max_rows=1000)  # record_f1 stops at MAX_ROWS, well before its time limit
    finally:
        conn.close()


# --- scoring a submission, the baseline and the oracle


def test_oracle_and_placeholder_scores(demo: SqlDemoPaths) -> None:
    assert score_sql(demo.solution, demo.solution, demo.db) == 1.0  # gold vs gold
    assert score_sql(demo.solution, demo.sample_submission, demo.db) < 0.1


def test_score_matches_by_id_and_blank_queries_score_zero(demo: SqlDemoPaths, tmp_path: Path) -> None:
    solution = pd.read_csv(demo.solution)
    shuffled = solution.sample(frac=1.0, random_state=0)
    shuffled.to_csv(tmp_path / "shuffled.csv", index=False)
    assert score_sql(demo.solution, tmp_path / "shuffled.csv", demo.db) == 1.0  # by id, not by row order
    blank = solution.assign(query=solution["query"].where(solution.index >= 30, ""))
    blank.to_csv(tmp_path / "blank.csv", index=False)
    assert score_sql(demo.solution, tmp_path / "blank.csv", demo.db) == pytest.approx(1 - 30 / len(solution))
    solution.iloc[:-1].to_csv(tmp_path / "short.csv", index=False)
    with pytest.raises(DataError, match=r"has \d+ rows, the solution \d+"):
        score_sql(demo.solution, tmp_path / "short.csv", demo.db)
    solution.rename(columns={"query": "sql"}).to_csv(tmp_path / "renamed.csv", index=False)
    with pytest.raises(DataError, match=r"no 'query' column.*columns id,query"):
        score_sql(demo.solution, tmp_path / "renamed.csv", demo.db)


def test_baseline_is_far_below_one(demo: SqlDemoPaths) -> None:
    query = most_common_query(demo.train)
    assert query in set(pd.read_csv(demo.train)["query"])
    f1 = baseline_f1(demo)
    print(f"\nbaseline (most common training query for every test row): mean record F1 {f1:.4f}: {query}")
    assert 0.0 <= f1 < 0.2


# --- the demo's metric as kitlib sees it: a user's metric file (metric = "<demo folder>/sql_metric.py:record_f1")


def test_a_broken_solution_query_stops_scoring_with_the_row_the_query_and_the_fix(
    demo: SqlDemoPaths, tmp_path: Path
) -> None:
    """00 reads no solution.csv (a competition has none): its references are checked when a submission is scored."""
    from kitlib.tasks.scoring import score

    metric = parameters(demo.root)["metric"]
    solution = pd.read_csv(demo.solution)
    solution.loc[0, "query"] = "SELECT * FROM nowhere"
    solution.to_csv(tmp_path / "solution.csv", index=False)
    (tmp_path / DB_FILE).write_bytes(demo.db.read_bytes())
    assert score(demo.solution, demo.solution, target="query", metric=metric) == 1.0  # data_dir: the solution's
    with pytest.raises(DataError) as caught:
        score(tmp_path / "solution.csv", demo.solution, target="query", metric=metric)
    assert re.search(r"reference query at row 0 fails on shop\.sqlite .*no such table: nowhere", str(caught.value))
    assert "Fix: correct or drop those rows" in str(caught.value)


def test_a_demo_without_its_database_stops_00_naming_the_fix(tmp_path: Path, cpu_hw: object) -> None:
    from kitlib.errors import SetupError
    from kitlib.notebook import stages

    paths = make_sql_demo(tmp_path / "sql", n_train=40, n_test=8)
    paths.db.unlink()
    p = stages.params(environ={}, data_dir=paths.root, work_dir=tmp_path / "work", preset="smoke", model="tiny",
                      **parameters(paths.root))  # fmt: skip
    with pytest.raises(SetupError, match=r"executes the generated SQL .* holds \[\]: put exactly one SQLite file"):
        stages.setup(p, cpu_hw)  # type: ignore[arg-type]
    assert not (tmp_path / "work").exists()


def test_the_demos_metric_loads_where_a_kernel_runs_outside_the_clone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A notebook's kernel runs in its own folder, where the clone's ``demos`` is not importable (nor on Kaggle): the
    demo's metric is the file the writer copied beside its data, loaded by path; it needs no ``demos`` import, kitlib
    adds nothing to sys.path, and nothing is written beside it (no __pycache__)."""
    import sys

    from kitlib.tasks.metrics import get_metric, import_object

    paths = make_sql_demo(tmp_path / "sql", n_train=40, n_test=8)
    spec = parameters(paths.root)["metric"]
    assert spec == f"{(paths.root / 'sql_metric.py').resolve()}:record_f1"
    clone = Path(__file__).resolve().parents[1]
    assert (paths.root / "sql_metric.py").read_bytes() == (clone / "demos" / "sql_metric.py").read_bytes()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(clone))])
    for name in [m for m in sys.modules if m == "demos" or m.startswith("demos.")]:
        monkeypatch.delitem(sys.modules, name)
    before, files = list(sys.path), sorted(paths.root.iterdir())
    assert not import_object(spec, "metric").__module__.startswith("demos")
    solution = pd.read_csv(paths.solution)["query"].to_numpy()
    metric = get_metric(spec, "sequence", data_dir=paths.root)
    assert metric.scores(solution, solution).tolist() == [1.0] * len(solution)  # each row's score
    assert sys.path == before and "demos" not in sys.modules and sorted(paths.root.iterdir()) == files
