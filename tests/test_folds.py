"""k-fold, as Kaggle users work (``folds``, ``group_column``): every row validated by exactly one fold, classes
spread evenly, groups kept whole; 02 trains one run per fold through the one fit path, saves the out-of-fold
predictions and judges the verdict on them; 03 averages the fold models."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from kitlib.data.tables import DataError
from kitlib.notebook import stages, training
from kitlib.notebook.estimate import estimate_run
from kitlib.notebook.presets import resolve


@pytest.mark.parametrize("folds", [2, 3, 5])
def test_every_row_is_validated_once_classes_keep_their_shares_and_groups_stay_whole(folds: int) -> None:
    rng = np.random.default_rng(1)
    labels = rng.choice([0, 1, 2], 203, p=[0.7, 0.2, 0.1])
    groups = rng.integers(0, 40, 203)
    for given in ({}, {"labels": labels}, {"groups": groups}):
        pairs = stages.splits(203, 7, folds, **given)
        assert len(pairs) == folds
        validated = np.concatenate([valid for _, valid in pairs])
        assert sorted(validated.tolist()) == list(range(203)), given  # each row exactly once
        for train, valid in pairs:
            assert not set(train) & set(valid) and len(train) + len(valid) == 203
            if "groups" in given:
                assert not set(groups[train]) & set(groups[valid])  # no group on both sides
        if "labels" in given:
            for c in range(3):  # each class dealt out: its rows per fold differ by at most one
                per_fold = [int(np.sum(labels[valid] == c)) for _, valid in pairs]
                assert max(per_fold) - min(per_fold) <= 1, (c, per_fold)
    one, before = stages.splits(203, 7, 1, labels)[0], stages._split(203, 7, labels)
    assert all(np.array_equal(a, b) for a, b in zip(one, before, strict=True))  # folds = 1: the hold-out as before
    train, valid = stages.splits(203, 7, 1, groups=groups)[0]  # one hold-out of whole groups, about 10% of the rows
    assert not set(groups[train]) & set(groups[valid]) and 10 <= len(valid) <= 40


def _classes(folder: Path, n: int = 96, rare: int = 8) -> Path:
    """Two classes told apart by one word; ``rare`` rows of the second; a ``shop`` column of 6 groups."""
    folder.mkdir()
    y = np.r_[np.ones(rare, np.int64), np.zeros(n - rare, np.int64)]
    words = np.where(y == 1, "great", "poor")
    frame = pd.DataFrame({"id": range(n), "text": [f"a {w} film number {i}" for i, w in enumerate(words)],
                          "shop": [f"s{i % 6}" for i in range(n)], "label": y})  # fmt: skip
    frame.to_csv(folder / "train.csv", index=False)
    frame.iloc[:20][["id", "text", "shop"]].to_csv(folder / "test.csv", index=False)
    frame.iloc[:20][["id"]].assign(label=0).to_csv(folder / "sample_submission.csv", index=False)
    return folder


def test_a_missing_group_column_or_too_many_folds_is_a_clear_error(tmp_path: Path, cpu_hw: Any) -> None:
    data = _classes(tmp_path / "data", rare=3)
    given = {"data_dir": data, "work_dir": tmp_path / "work", "preset": "smoke", "model": "tiny", "task": "classify"}
    with pytest.raises(DataError, match=r"group_column 'store' is not a column.*\['id', 'text', 'shop', 'label'\]"):
        stages.setup(stages.params(**given, group_column="store"), cpu_hw)
    with pytest.raises(DataError, match=r"folds = 4, but class 1 has 3 rows.*folds <= 3"):
        stages.setup(stages.params(**given, folds=4), cpu_hw)
    with pytest.raises(DataError, match=r"folds = 7, but .* has 6 groups in 'shop'"):
        stages.setup(stages.params(**given, folds=7, group_column="shop"), cpu_hw)
    assert not (tmp_path / "work" / "run.json").exists()  # nothing written by a refused setup


def test_the_estimate_counts_k_models_and_offers_folds_on_small_data(cpu_hw: Any) -> None:
    run = resolve("balanced", cpu_hw)
    one, five = estimate_run(run, 800, 200, cpu_hw), estimate_run(run, 800, 200, cpu_hw, folds=5)
    assert five.train_s == pytest.approx(5 * one.train_s) and five.features_s == one.features_s
    assert "small data: folds = 5" in one.text() and "5 folds: 02 and 03 x 5" in five.text()
    assert "folds" not in estimate_run(run, 50_000, 200, cpu_hw).text()


def test_two_folds_through_the_notebooks_route_oof_verdict_and_03_averages_both(
    tmp_path: Path, cpu_hw: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = _classes(tmp_path / "data")
    p = stages.params(data_dir=data, work_dir=tmp_path / "work", preset="smoke", model="tiny", task="classify",
                      folds=2, group_column="shop")  # fmt: skip
    stages.setup(p, cpu_hw)
    feats = stages.features(p, hw=cpu_hw, quiet=True)
    assert feats.groups is not None and len(np.unique(feats.groups)) == 6
    result = training.train(p, hw=cpu_hw)
    oof = pd.read_csv(p.run_dir / training.OOF_FILE)
    assert oof["row"].tolist() == list(range(feats.n_train)) and set(oof["fold"]) == {1, 2}  # every row, once
    train = pd.read_csv(data / "train.csv")
    assert np.array_equal(oof["target"], train["label"].to_numpy()[oof["row"]])  # beside its row's truth
    shops = train["shop"].to_numpy()
    assert all(oof.groupby(shops[oof["row"]])["fold"].nunique() == 1)  # a shop's rows in one fold
    record = json.loads((p.run_dir / stages.BASELINE_FILE).read_text())
    assert record["folds"] == 2 and record["gap"]["rows"] == feats.n_train  # judged on every row, out of fold
    assert "out of fold (2 folds)" in result.summary() and (tmp_path / "work" / "run-fold2" / "best").is_dir()
    task, combined = stages.get_task(p.task), []
    combine = task.combine
    monkeypatch.setattr(task, "combine", lambda predictions: combined.append(len(predictions)) or combine(predictions))
    monkeypatch.setattr(training, "get_task", lambda name: task)
    training.infer(p, hw=cpu_hw)
    assert combined == [2]  # run/ and run-fold2/, averaged
    assert "out of fold (2 folds)" in "\n".join(stages.outcome(p.work_dir))


@pytest.mark.slow
def test_folds_through_the_four_notebooks_headless(tmp_path: Path) -> None:
    from kitlib.notebook.runbook import run_notebooks

    data, work = _classes(tmp_path / "data"), tmp_path / "work"
    params = {"data_dir": str(data), "work_dir": str(work), "preset": "smoke", "model": "tiny", "folds": 2}
    run_notebooks(work / "executed", parameters=params)
    oof = pd.read_csv(work / "run" / training.OOF_FILE)
    assert oof["row"].tolist() == list(range(96)) and (work / "run-fold2" / "best").is_dir()
    assert len(pd.read_csv(work / "submission.csv")) == 20
    assert "out of fold (2 folds)" in "\n".join(stages.outcome(work))


def test_a_kaggle_chain_carries_every_folds_run_to_03(tmp_path: Path) -> None:
    from kitlib.notebook.params import carry_forward

    earlier = tmp_path / "earlier"  # 02's kernel output, mounted read-only in 03's
    for run in ("run", "run-fold2", "run-fold3"):
        (earlier / run / "best").mkdir(parents=True)
        (earlier / run / "best" / "model.safetensors").write_bytes(b"w")
    assert {"run", "run-fold2", "run-fold3"} <= set(carry_forward([earlier], tmp_path / "work"))
    assert (tmp_path / "work" / "run-fold3" / "best" / "model.safetensors").is_file()


def test_02_interrupted_in_fold_3_keeps_folds_1_and_2_and_ends_as_an_uninterrupted_run(
    tmp_path: Path, cpu_hw: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """#32: SIGTERM during fold 3, then 02 again: folds 1 and 2 are not trained again (their best/ untouched), fold 3
    continues from its last/, and oof.csv and the verdict equal an uninterrupted run's."""
    import os
    import signal

    from kitlib import Callback

    data = _classes(tmp_path / "data")

    def ready(work: Path) -> Any:
        p = stages.params(data_dir=data, work_dir=work, preset="smoke", model="tiny", task="classify", folds=3)
        stages.setup(p, cpu_hw)
        stages.features(p, hw=cpu_hw, quiet=True)
        return p

    whole = ready(tmp_path / "whole")
    training.train(whole, hw=cpu_hw)

    class Term(Callback):  # as a session's end: SIGTERM at fold 3's first step, kitlib saves last/ and stops
        def on_fit_start(self, loop: Any) -> None:
            self.loop = loop

        def on_step_end(self, step: object) -> None:
            if self.loop.out.name == "run-fold3.new" and self.loop.state.step == 1:
                os.kill(os.getpid(), signal.SIGTERM)

    p = ready(tmp_path / "cut")
    assert training.train(p, hw=cpu_hw, callbacks=(Term(),)).stop_reason == "sigterm"
    assert (p.work_dir / "run-fold3.new" / "last").is_dir() and not (p.run_dir / training.OOF_FILE).exists()
    finished = [f for run in ("run", "run-fold2") for f in (p.work_dir / run / "best").iterdir()]
    when = [f.stat().st_mtime_ns for f in finished]
    trained, train_fold = [], training._train_fold
    monkeypatch.setattr(training, "_train_fold", lambda q, *a: trained.append(q.fold) or train_fold(q, *a))
    capsys.readouterr()
    result = training.train(p, hw=cpu_hw)
    assert trained == [2] and [f.stat().st_mtime_ns for f in finished] == when  # folds 1 and 2 kept as they were
    said = capsys.readouterr().out
    assert "folds 1, 2 of 3 kept" in said and "folds 1, 2 of 3 kept" in result.summary()
    assert "continuing the interrupted run in" in said and "run-fold3.new" in said, said  # from its last/
    expected = pd.read_csv(whole.run_dir / training.OOF_FILE)
    pd.testing.assert_frame_equal(pd.read_csv(p.run_dir / training.OOF_FILE), expected)
    verdict = [json.loads((q.run_dir / stages.BASELINE_FILE).read_text()) for q in (whole, p)]
    assert verdict[0] == verdict[1] and result.best_epoch is not None and len(result.history)
