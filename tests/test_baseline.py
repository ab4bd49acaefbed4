"""The trivial baseline (kitlib.tasks.baseline): every run is scored against a constant answer on its own validation
rows, 00 saves it in run.json, 02 shows it beside the model's score, and 02 and 03 say so when the model loses."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kitlib.notebook import stages
from kitlib.progress import figure
from kitlib.tasks.baseline import trivial_baseline
from kitlib.tasks.metrics import get_metric


def test_the_constant_is_the_one_the_metric_rewards_chosen_on_train() -> None:
    y = np.random.default_rng(0).lognormal(3.0, 1.0, 2000)  # heavy right tail: mean far above the median
    train, valid = y[:1800], y[1800:]
    rmse = trivial_baseline(get_metric("rmse", "regression"), kind="regression", train=train, valid=valid)
    mae = trivial_baseline(get_metric("mae", "regression"), kind="regression", train=train, valid=valid)
    assert "mean" in rmse.what and "median" in mae.what
    assert mae.score == pytest.approx(np.mean(np.abs(valid - np.median(train))))
    smape = trivial_baseline(get_metric("smape", "regression"), kind="regression", train=train, valid=valid)
    median_smape = get_metric("smape", "regression")(valid, np.full(len(valid), np.median(train)))
    assert smape.score <= median_smape + 1.0  # SMAPE's best constant sits below the median, not above it
    labels = np.array(["a"] * 6 + ["b"] * 3 + ["c"])
    majority = trivial_baseline(get_metric("accuracy", "multiclass"), kind="multiclass", train=labels, valid=labels)
    assert (majority.score, "'a'" in majority.what) == (0.6, True)
    assert majority.beaten_by(0.61) and not majority.beaten_by(0.6)
    assert majority.verdict(0.7, "multiclass").endswith("beats the trivial baseline (the most common training class "
                                                        "'a': 0.6) by 0.1")  # fmt: skip


def _unpredictable(folder: Path, n_train: int = 240, n_test: int = 40) -> Path:
    """Every row has the same text, so no model can do better than one constant answer: the majority class."""
    n = n_train + n_test
    frame = pd.DataFrame(
        {"id": range(n), "text": "the same words for every row", "label": ["yes", "no", "no", "no"] * (n // 4)}
    )
    folder.mkdir()
    frame.iloc[:n_train].to_csv(folder / "train.csv", index=False)
    frame.iloc[n_train:][["id", "text"]].to_csv(folder / "test.csv", index=False)
    frame.iloc[n_train:][["id"]].assign(label="no").to_csv(folder / "sample_submission.csv", index=False)
    return folder


def test_a_target_the_inputs_cannot_predict_is_flagged_in_02_and_03(tmp_path: Path, cpu_hw) -> None:
    p = stages.params(
        data_dir=_unpredictable(tmp_path / "data"), work_dir=tmp_path / "work", preset="smoke", model="tiny"
    )
    stages.setup(p, cpu_hw)
    saved = json.loads((p.work_dir / "run.json").read_text())["baseline"]
    assert saved["metric"] == "accuracy" and 0.5 < saved["score"] < 1 and "'no'" in saved["what"]
    stages.features(p, hw=cpu_hw, quiet=True)
    result = stages.train(p, hw=cpu_hw)
    summary = result.summary()
    print(summary)
    assert f"trivial baseline (the most common training class 'no'): accuracy {figure(saved['score'])}" in summary
    assert "does not beat the trivial baseline" in summary and "Try:" in summary
    history = pd.read_csv(p.run_dir / "history.csv")  # one constant: said once (summary, baseline.json), not per row
    assert not [c for c in [*history, *result.history] if c.startswith("baseline")]
    record = json.loads((p.run_dir / "baseline.json").read_text())
    assert record["beaten"] is False and record["model_score"] <= saved["score"]
    with pytest.warns(UserWarning, match="does not beat the trivial baseline") as warned:
        stages.infer(p, hw=cpu_hw)
    assert (p.work_dir / "submission.csv").is_file()
    # the red box names the caller's line (a notebook cell's), not kitlib's or contextlib's frames
    assert [Path(w.filename).name for w in warned] == [Path(__file__).name]


def test_a_model_that_beats_the_baseline_gets_no_warning(tmp_path: Path, cpu_hw) -> None:
    from test_tasks import _competition

    p = stages.params(data_dir=_competition(tmp_path / "data"), work_dir=tmp_path / "work", preset="fast", model="tiny")
    stages.setup(p, cpu_hw)
    stages.features(p, hw=cpu_hw, quiet=True)
    result = stages.train(p, hw=cpu_hw)
    summary = result.summary()
    assert "does not beat" not in summary and "warning" not in summary
    beats = re.search(
        r"the model \(accuracy ([\d.]+)\) beats the trivial baseline \(.*: ([\d.]+)\) by ([\d.]+)", summary
    )
    assert beats, summary
    assert abs(float(beats[1]) - float(beats[2]) - float(beats[3])) < 2e-3  # the margin said, 4 digits each
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        stages.infer(p, hw=cpu_hw)
