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

from kitlib.errors import SetupError
from kitlib.notebook import stages, training
from kitlib.progress import figure
from kitlib.tasks.baseline import compare, trivial_baseline
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
    assert majority.verdict(0.7, "multiclass") is None  # beaten: stages.verdict_of says by how much, with its interval


def test_the_smape_constant_is_found_by_a_search_not_read_off_the_percentiles() -> None:
    """The constant is within 0.005 SMAPE of the best of 4,000 candidates on train (a dense grid: the search's
    truth), and at least as good there as the median and every 2.5th percentile."""
    y = np.random.default_rng(1).lognormal(7.0, 1.5, 675)  # a price-like target spanning orders of magnitude
    metric = get_metric("smape", "regression")
    found = trivial_baseline(metric, kind="regression", train=y, valid=y)
    dense = min(metric(y, np.full(len(y), c)) for c in np.geomspace(y.min(), y.max(), 4000))
    grid = min(metric(y, np.full(len(y), c)) for c in np.quantile(y, np.linspace(0, 1, 41)))
    assert found.score <= dense + 0.005 < grid  # the percentiles' best is 0.014 worse here
    assert "the train value smape scores best" in found.what


def test_the_verdict_says_unclear_when_the_interval_straddles_zero_and_advises_only_what_was_not_done() -> None:
    """169 validation rows: a model a hair better than the constant is "unclear" (its 90% interval straddles zero),
    one that tracks the truth beats it, one worse loses; the advice skips the preset and loss the run already used."""
    rng = np.random.default_rng(0)
    y = rng.lognormal(7.0, 1.5, 169)
    metric = get_metric("smape", "regression")
    base = trivial_baseline(metric, kind="regression", train=rng.lognormal(7.0, 1.5, 675), valid=y)
    constant = base.constant(len(y))
    close = constant * rng.uniform(0.8, 1.2, len(y))  # noise around the constant: as good, give or take
    good = y * rng.uniform(0.8, 1.25, len(y))
    gaps = {name: compare(metric, y, pred, constant) for name, pred in [("close", close), ("good", good)]}
    assert gaps["close"].low < 0 < gaps["close"].high and gaps["good"].low > 0
    unclear = base.verdict(metric(y, close), "regression", gaps["close"], done={"balanced", "mae"})
    assert unclear is not None and unclear.startswith("unclear whether the model") and "interval" in unclear
    assert "best preset" in unclear and "balanced preset" not in unclear and "absolute-error" not in unclear
    assert base.verdict(metric(y, good), "regression", gaps["good"]) is None
    worse = compare(metric, y, constant * 3, constant)
    lost = base.verdict(metric(y, constant * 3), "regression", worse, done={"best"})
    assert worse.high < 0 and lost is not None and "does not beat" in lost and "preset" not in lost
    labels = np.array(["a", "b"] * 60)
    accuracy = get_metric("accuracy", "binary")
    tie = compare(accuracy, labels, np.where(rng.random(120) < 0.5, labels, "a"), np.full(120, "a"))
    assert tie.low < 0 < tie.high or tie.low > 0  # accuracy resamples per row; macro_f1 by whole resamples:
    f1 = compare(get_metric("macro_f1", "binary"), labels, labels, np.full(120, "a"))
    assert f1.low > 0 and f1.gain == pytest.approx(1.0 - 1 / 3)


SEEN: list[Path | None] = []


def shared_words(y_true: np.ndarray, y_pred: np.ndarray, *, data_dir: Path) -> np.ndarray:
    """A user's text metric: each row's share of the reference's words generated, stop words (a file in the
    competition's data folder) aside."""
    SEEN.append(data_dir)
    stop = set((data_dir / "stopwords.txt").read_text().split())
    words = [(set(str(t).split()) - stop, set(str(p).split())) for t, p in zip(y_true, y_pred, strict=True)]
    return np.array([len(t & p) / max(len(t), 1) for t, p in words])


def test_a_users_text_metric_gets_the_data_folder_and_its_row_scores_make_the_verdict_one_pass(
    tmp_path: Path,
) -> None:
    (tmp_path / "stopwords.txt").write_text("the a of")
    metric = get_metric("test_baseline:shared_words", "sequence", data_dir=tmp_path)
    assert "sequence" in metric.kinds and metric.mode == "max"
    rng = np.random.default_rng(0)
    y = np.array([f"the price of item {i} is {rng.integers(100)}" for i in range(300)], dtype=object)
    model = np.where(rng.random(300) < 0.7, y, "the price")  # 70% right
    base = trivial_baseline(metric, kind="sequence", train=y, valid=y)
    SEEN.clear()
    gap = compare(metric, y, model, base.constant(len(y)))
    assert [tmp_path, tmp_path] == SEEN  # one call a side over every row, none per resample
    expected = metric(y, model) - base.score
    assert gap.gain == pytest.approx(expected) and gap.low < expected < gap.high and gap.low > 0
    with pytest.raises(SetupError, match=r"returned \(2,\) scores for 300 rows.*each row's score"):
        get_metric("test_baseline:two_scores", "sequence")(y, model)  # neither a number nor one per row


def two_scores(y_true: np.ndarray, y_pred: np.ndarray) -> np.ndarray:
    return np.zeros(2)


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
    result = training.train(p, hw=cpu_hw)
    summary = result.summary()
    print(summary)
    assert f"trivial baseline (the most common training class 'no'): accuracy {figure(saved['score'])}" in summary
    assert "does not beat the trivial baseline" in summary and "Try:" in summary
    history = pd.read_csv(p.run_dir / "history.csv")  # one constant: said once (summary, baseline.json), not per row
    assert not [c for c in [*history, *result.history] if c.startswith("baseline")]
    record = json.loads((p.run_dir / "baseline.json").read_text())
    assert record["beaten"] is False and record["model_score"] <= saved["score"]
    assert record["gap"]["high"] <= 0 and f"over {record['gap']['rows']} validation rows" in summary  # interval
    with pytest.warns(UserWarning, match="does not beat the trivial baseline") as warned:
        training.infer(p, hw=cpu_hw)
    assert (p.work_dir / "submission.csv").is_file()
    # the red box names the caller's line (a notebook cell's), not kitlib's or contextlib's frames
    assert [Path(w.filename).name for w in warned] == [Path(__file__).name]


def test_a_model_that_beats_the_baseline_gets_no_warning(tmp_path: Path, cpu_hw) -> None:
    from test_tasks import _competition

    p = stages.params(data_dir=_competition(tmp_path / "data"), work_dir=tmp_path / "work", preset="fast", model="tiny")
    stages.setup(p, cpu_hw)
    stages.features(p, hw=cpu_hw, quiet=True)
    result = training.train(p, hw=cpu_hw)
    summary = result.summary()
    assert "does not beat" not in summary and "warning" not in summary
    beats = re.search(
        r"the model \(accuracy ([\d.]+)\) beats the trivial baseline \(.*: ([\d.]+)\): \+([\d.]+) better", summary
    )
    assert beats, summary
    assert abs(float(beats[1]) - float(beats[2]) - float(beats[3])) < 2e-3  # the margin said, 4 digits each
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        training.infer(p, hw=cpu_hw)
