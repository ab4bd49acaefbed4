from __future__ import annotations

import importlib.util
from pathlib import Path
from unittest import mock

import numpy as np
import pandas as pd
import pytest

from demos import DemoDataMissing, DemoPaths
from demos.price import (
    CATEGORICAL,
    NUMERIC,
    TARGET,
    _smape,
    load_films,
    make_price_demo,
    median_baseline,
    movies_db_path,
    score_price,
)
from kitlib.data.tables import DataError

needs_data = pytest.mark.skipif(
    importlib.util.find_spec("bokeh_sampledata") is None,
    reason="the price demo's films ship with bokeh-sampledata: pip install --no-deps 'bokeh-sampledata>=2026.1'",
)
FEATURES = ["id", "text", *NUMERIC, *CATEGORICAL]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> DemoPaths:
    return make_price_demo(tmp_path_factory.mktemp("demo_price"), seed=0)


# --- SMAPE: pure numpy, no data needed
def test_smape_known_values() -> None:
    assert _smape([100.0], [110.0]) == pytest.approx(100 * 2 * 10 / 210)  # 9.5238...
    assert _smape([100.0], [110.0]) == pytest.approx(9.523809523809524)
    assert _smape([0.0], [0.0]) == 0.0  # 0/0 counts as 0
    assert _smape([0.0, 100.0], [0.0, 100.0]) == 0.0
    assert _smape([0.0], [5.0]) == 200.0  # the maximum
    assert _smape([1.0, 2.0], [2.0, 2.0]) == pytest.approx((200 / 3 + 0) / 2)


def test_smape_is_symmetric_in_its_arguments() -> None:
    rng = np.random.default_rng(0)
    a, f = rng.lognormal(3, 2, 50), rng.lognormal(3, 2, 50)
    assert _smape(a, f) == pytest.approx(_smape(f, a))
    assert 0.0 <= _smape(a, f) <= 200.0


def test_smape_rejects_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match="equal, non-empty"):
        _smape([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="equal, non-empty"):
        _smape([], [])


def test_missing_package_names_the_install_command() -> None:
    with (
        mock.patch("importlib.util.find_spec", return_value=None),
        pytest.raises(DemoDataMissing, match=r"pip install --no-deps 'bokeh-sampledata>=2026.1'"),
    ):
        movies_db_path()


@needs_data
def test_too_old_package_names_the_upgrade() -> None:
    with (
        mock.patch("importlib.metadata.version", return_value="2024.2"),
        pytest.raises(DemoDataMissing, match=r"2024.2 carries an older movies.db.*--upgrade"),
    ):
        movies_db_path()


# --- the files
@needs_data
def test_files_and_columns(demo: DemoPaths) -> None:
    train, test = pd.read_csv(demo.train), pd.read_csv(demo.test)
    sample, solution = pd.read_csv(demo.sample_submission), pd.read_csv(demo.solution)
    assert list(train.columns) == [*FEATURES, TARGET]
    assert list(test.columns) == FEATURES  # no target leaked
    assert list(sample.columns) == list(solution.columns) == ["id", TARGET]
    assert test["id"].tolist() == solution["id"].tolist() == sample["id"].tolist()
    assert not set(train["id"]) & set(test["id"])
    assert len(train) + len(test) == 2760  # every film with a reported box office (bokeh-sampledata 2026.1)
    assert len(test) == round(0.2 * 2760)
    for column in NUMERIC:
        assert pd.api.types.is_numeric_dtype(train[column]), column
    for column in CATEGORICAL:
        assert train[column].notna().all() and train[column].nunique() > 2, column
    assert train["text"].str.split().str.len().median() > 20  # a description, not a one-word name
    target = train[TARGET]
    assert (target > 0).all() and target.mean() > 2 * target.median()  # positive, heavy right tail
    assert sample[TARGET].nunique() == 1 and sample[TARGET].iloc[0] == pytest.approx(target.median())
    # the held-out values are the source's, not something derived from train
    films = load_films()
    assert sorted(solution[TARGET]) == sorted(films[TARGET][films["text"].isin(test["text"])])


@needs_data
def test_deterministic_for_a_seed(demo: DemoPaths, tmp_path: Path) -> None:
    again = make_price_demo(tmp_path / "a", seed=0)
    make_price_demo(tmp_path / "a", seed=0)  # a second run over its own files changes nothing
    for name in ("train", "test", "sample_submission", "solution"):
        assert getattr(again, name).read_bytes() == getattr(demo, name).read_bytes()
    other = make_price_demo(tmp_path / "b", seed=1)
    assert other.solution.read_bytes() != demo.solution.read_bytes()
    assert not list((tmp_path / "a").glob(".*.tmp"))


@needs_data
def test_never_overwrites_a_users_own_files(tmp_path: Path) -> None:
    mine = tmp_path / "comp"
    mine.mkdir()
    (mine / "train.csv").write_text("id,text,box_office\n1,mine,5\n")
    with pytest.raises(DataError, match=r"already holds train.csv, not written by `kitlib demo`.*--force"):
        make_price_demo(mine)
    assert (mine / "train.csv").read_text() == "id,text,box_office\n1,mine,5\n"
    make_price_demo(mine, force=True)  # asked for
    make_price_demo(mine)  # a folder the demo wrote is the demo's to rewrite


@needs_data
def test_score_and_median_baseline(demo: DemoPaths, tmp_path: Path) -> None:
    assert score_price(demo.solution, demo.solution) == 0.0
    baseline = median_baseline(demo)
    print(f"\nprice demo (seed 0): median-baseline SMAPE = {baseline:.2f}")
    assert baseline == pytest.approx(115.494, abs=0.01)
    assert score_price(demo.solution, demo.sample_submission) == pytest.approx(baseline)
    solution = pd.read_csv(demo.solution)
    shuffled = solution.sample(frac=1.0, random_state=0).assign(**{TARGET: lambda d: d[TARGET] * 1.1})
    shuffled.to_csv(tmp_path / "close.csv", index=False)
    assert score_price(demo.solution, tmp_path / "close.csv") == pytest.approx(200 * 0.1 / 2.1)  # matched by id


@needs_data
@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda d: d.assign(id=d["id"] + 10**6), r"ids do not match.*missing"),
        (lambda d: d.iloc[:-1], r"has \d+ rows, the solution \d+"),
        (lambda d: d.assign(box_office=d[TARGET].where(d.index != 3)), r"no box_office for id .* \(row 3"),
        (lambda d: d.assign(box_office="lots"), r"box_office 'lots' for id .* is not a finite number"),
        (lambda d: d.rename(columns={TARGET: "label"}), r"no 'box_office' column.*id,box_office"),
    ],
    ids=["wrong-ids", "row-count", "nan", "not-a-number", "missing-column"],
)
def test_score_rejects_bad_submissions(demo: DemoPaths, tmp_path: Path, edit: object, expected: str) -> None:
    bad = edit(pd.read_csv(demo.solution))  # type: ignore[operator]
    bad.to_csv(tmp_path / "sub.csv", index=False)
    with pytest.raises(DataError, match=expected):
        score_price(demo.solution, tmp_path / "sub.csv")
