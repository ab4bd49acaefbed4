"""Competitions that are not the demos: blank text cells, whole-number targets, a class of one row, string labels."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kitlib.data.tables import DataError
from kitlib.notebook import stages, training

WORDS = {"pos": ["great", "lovely", "superb"], "neg": ["awful", "dull", "boring"], "odd": ["strange"]}


def _competition(folder: Path, labels: list[str], *, blank_every: int = 0, extra: dict | None = None) -> Path:
    """train/test/sample_submission with string ids; every ``blank_every``-th text cell blank (train and test)."""
    rows = pd.DataFrame(
        {
            "qid": [f"q{i:04d}" for i in range(len(labels))],
            "body": [f"a {WORDS[label][i % len(WORDS[label])]} film" for i, label in enumerate(labels)],
            "topic": labels,
            **(extra or {}),
        }
    )
    if blank_every:
        rows.loc[rows.index % blank_every == 0, "body"] = None  # written as an empty cell: reads back as NaN
    folder.mkdir(parents=True)
    n_test = len(rows) // 5
    rows.iloc[n_test:].to_csv(folder / "train.csv", index=False)
    rows.iloc[:n_test].drop(columns=["topic"]).to_csv(folder / "test.csv", index=False)
    rows.iloc[:n_test][["qid"]].assign(topic="pos").to_csv(folder / "sample_submission.csv", index=False)
    return folder


def _run(data: Path, work: Path, cpu_hw, **values) -> pd.DataFrame:  # type: ignore[no-untyped-def]
    p = stages.params(environ={}, data_dir=data, work_dir=work, model="tiny", text="body", target="topic", id="qid",
                      **{"preset": "smoke", **values})  # fmt: skip
    stages.setup(p, cpu_hw)
    stages.features(p, hw=cpu_hw, quiet=True)
    training.train(p, hw=cpu_hw)
    return training.infer(p, hw=cpu_hw)


@pytest.mark.parametrize("preset", ["smoke", "fast"])
def test_blank_text_cells_in_train_and_test_run_to_a_valid_submission(tmp_path: Path, cpu_hw, preset: str) -> None:
    labels = [("pos", "neg")[i % 2] for i in range(200)]
    data = _competition(tmp_path / "data", labels, blank_every=7)
    test = pd.read_csv(data / "test.csv")
    assert test["body"].isna().sum() > 0 and pd.read_csv(data / "train.csv")["body"].isna().sum() > 0
    with pytest.warns(UserWarning, match=r"text column 'body' is blank at .*empty text ''"):
        submission = _run(data, tmp_path / "work", cpu_hw, preset=preset)
    written = pd.read_csv(tmp_path / "work" / "submission.csv")
    assert written["qid"].tolist() == test["qid"].tolist() and set(written["topic"]) <= {"pos", "neg"}
    assert written["topic"].notna().all() and len(submission) == len(test)


def test_a_class_of_one_row_trains_without_validation_rows_with_a_warning(tmp_path: Path, cpu_hw) -> None:
    labels = [("pos", "neg")[i % 2] for i in range(150)]
    labels[-1] = "odd"  # one training row of its class: a Kaggle user cannot add rows
    data = _competition(tmp_path / "data", labels)
    with pytest.warns(UserWarning, match=r"class 'odd' has 1 row .*all train.*never sees"):
        submission = _run(data, tmp_path / "work", cpu_hw)
    assert len(submission) == 30
    codes = np.array([{"neg": 0, "odd": 1, "pos": 2}[label] for label in labels[30:]])
    train, valid = stages._split(len(codes), 42, codes)
    assert int(np.flatnonzero(codes == 1)[0]) in set(train) and not (codes[valid] == 1).any()
    assert sorted([*train, *valid]) == list(range(len(codes)))  # every row once
    plain = stages._split(len(codes), 42, np.where(codes == 1, 0, codes))
    assert all(np.array_equal(a, b) for a, b in zip(plain, stages._split(len(codes), 42), strict=True))


def test_a_whole_number_target_regresses_under_tabular_text_or_a_number_metric(tmp_path: Path) -> None:
    from kitlib.notebook.tasks import get_task

    counts = pd.Series(np.random.default_rng(0).integers(0, 1500, 4000), name="favorite_count")
    p = stages.params(environ={}, data_dir=tmp_path, work_dir=tmp_path / "w", task="tabular-text", numeric=["n"])
    with pytest.raises(DataError, match=r"distinct whole numbers over 4000 rows"):
        get_task("auto").target(counts, p, "auto")  # the values alone: kitlib will not guess
    assert get_task("auto").target(counts, p, "smape").kind == "regression"  # the metric says: a number
    assert get_task("tabular-text").target(counts, p, "auto").kind == "regression"  # a quantity beside columns
    assert get_task("tabular-text").target(counts % 3, p, "auto").kind == "multiclass"  # codes stay classes
    assert get_task("tabular-text").target(counts, p, "accuracy").kind == "multiclass"  # the metric's word wins


def test_score_any_competition_by_its_columns_and_metric(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kitlib.cli import main

    solution = pd.DataFrame({"qid": ["a1", "a2", "a3", "a4"], "topic": ["Twitter QandA", "007", "yes", "no"]})
    solution.to_csv(tmp_path / "solution.csv", index=False)
    solution.assign(topic=["Twitter QandA", "007", "yes", "yes"]).to_csv(tmp_path / "sub.csv", index=False)
    files = [str(tmp_path / "solution.csv"), str(tmp_path / "sub.csv")]
    assert main(["score", *files, "--target", "topic", "--id", "qid", "--metric", "accuracy"]) == 0
    assert capsys.readouterr().out.startswith("accuracy: 0.7500 (higher is better")  # strings compared as written
    assert main(["score", *files, "--target", "topic", "--id", "qid", "--metric", "macro_f1"]) == 0
    assert capsys.readouterr().out.startswith(f"macro_f1: {(1 + 1 + 2 / 3 + 0) / 4:.4f}")
    work = tmp_path / "work"  # a notebooks work dir: its params.json and run.json name the columns and the metric
    work.mkdir()
    (work / "params.json").write_text(json.dumps({"target": "topic", "id": "qid", "data_dir": str(tmp_path)}))
    (work / "run.json").write_text(json.dumps({"metric": "accuracy"}))
    assert main(["score", *files, "--work", str(work)]) == 0
    assert capsys.readouterr().out.startswith("accuracy: 0.7500")
    prices = pd.DataFrame({"qid": ["a1", "a2"], "topic": [100, 50]})
    prices.to_csv(tmp_path / "prices.csv", index=False)
    prices.assign(topic=[100.0, 150.0]).to_csv(tmp_path / "guess.csv", index=False)
    assert main(["score", str(tmp_path / "prices.csv"), str(tmp_path / "guess.csv"), "--work", str(work),
                 "--metric", "smape"]) == 0  # fmt: skip
    assert capsys.readouterr().out.startswith("smape: 50.0000 (lower is better")
