"""Trees beside the network on small text + tabular tables (kitlib.notebook.trees): at ``fast`` (frozen embeddings),
scikit-learn's HistGradientBoosting on the columns and the text's embeddings, blended with the network on the
validation rows in 02 and refitted by 03, so a price that depends on its columns in steps is learnt from them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from kitlib.notebook import stages, training
from kitlib.tasks.metrics import get_metric

pytest.importorskip("sklearn")


def _steps(folder: Path, n_train: int = 400, n_test: int = 100) -> Path:
    """Price = a step function of size and brand (what trees split on, and an MLP on 2 columns learns slowly), times
    noise; the text names the brand among filler words."""
    rng = np.random.default_rng(0)
    n = n_train + n_test
    size, brand = rng.uniform(0, 10, n), rng.choice(["acme", "bolt", "crux", "dyna"], n)
    price = np.where(size > 5, 400.0, 40.0) * np.where(brand == "crux", 5.0, 1.0) * rng.uniform(0.9, 1.1, n)
    filler = rng.choice(["fine", "solid", "plain", "neat"], n)
    frame = pd.DataFrame({"id": range(n), "text": [f"a {f} {b} item" for f, b in zip(filler, brand, strict=True)],
                          "size": size.round(3), "brand": brand, "price": price.round(2)})  # fmt: skip
    folder.mkdir()
    frame.iloc[:n_train].to_csv(folder / "train.csv", index=False)
    frame.iloc[n_train:][["id", "text", "size", "brand"]].to_csv(folder / "test.csv", index=False)
    frame.iloc[n_train:][["id"]].assign(price=1.0).to_csv(folder / "sample_submission.csv", index=False)
    frame.iloc[n_train:][["id", "price"]].to_csv(folder / "solution.csv", index=False)
    return folder


@pytest.mark.slow
def test_trees_learn_what_the_columns_say_at_fast_and_03_writes_the_blend(
    tmp_path: Path, cpu_hw: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _steps(tmp_path / "data")
    p = stages.params(data_dir=data, work_dir=tmp_path / "work", preset="fast", model="tiny", task="tabular-text",
                      target="price", metric="smape", numeric=("size",), categorical=("brand",))  # fmt: skip
    stages.setup(p, cpu_hw)
    stages.features(p, hw=cpu_hw, quiet=True)
    result = training.train(p, hw=cpu_hw)
    said = json.loads((p.run_dir / "trees.json").read_text())
    assert said["weight"] > 0 and said["blend"] <= min(said["network"], said["trees"]) + 1e-9, said
    assert "trees (scikit-learn HistGradientBoosting" in result.summary()
    record = json.loads((p.run_dir / "baseline.json").read_text())
    assert record["model_score"] == pytest.approx(said["blend"]) and record["beaten"], record  # the verdict: the blend
    capsys.readouterr()
    training.infer(p, hw=cpu_hw)
    assert "trees: " in capsys.readouterr().out
    solution = pd.read_csv(data / "solution.csv")
    written = pd.read_csv(p.work_dir / "submission.csv").set_index("id").loc[solution["id"], "price"]
    smape = get_metric("smape", "regression")(solution["price"].to_numpy(), written.to_numpy())
    assert smape < 25 and solution["price"].corr(pd.Series(written.to_numpy()), method="spearman") > 0.8, smape


def test_the_blend_keeps_the_network_on_a_tie_and_picks_classes_whole() -> None:
    from kitlib.notebook.trees import blend, mix

    metric = get_metric("mae", "regression")
    y = np.array([1.0, 2.0, 3.0, 4.0])
    assert blend(metric, y, y, y + 1, "regression") == (0.0, 0.0)  # the network is exact: no trees
    assert blend(metric, y, y + 1, y, "regression") == (1.0, 0.0)
    weight, _ = blend(metric, y, y + 1, y - 1, "regression")
    assert weight == 0.5 and mix(y + 1, y - 1, 0.5, "regression").tolist() == y.tolist()
    labels = np.array(["a", "b", "a"], dtype=object)
    assert blend(get_metric("accuracy", "binary"), labels, np.array(["b", "b", "b"]), labels, "binary")[0] == 1.0
