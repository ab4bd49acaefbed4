"""The code-competition route's pieces without a kernel run: `kaggle publish` (what the published folder holds, and
what it never holds), the inference kernel's metadata, and its checks of the published model against the data and
the time limit (one test per refusal). The whole route runs in tests/test_kaggle_sim.py."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from kitlib.cli import kernel_tool, main
from kitlib.errors import DataError, SetupError
from kitlib.machine.hardware import fake_profile
from kitlib.notebook import inference
from kitlib.notebook.presets import Choice, get_preset, resolve
from kitlib.notebook.submission import write_submission

kg = kernel_tool()
PARAMS = {"task": "auto", "id": "id", "target": "label", "metric": "auto", "text": "text", "numeric": ["year"],
          "categorical": [], "model": "tiny", "folds": 1, "test_file": "test.csv",
          "sample_submission": "sample_submission.csv", "inference_limit": 9.0}  # fmt: skip


def _write(path: Path, text: str = "x") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _work(root: Path, *, folds: int = 1, trained: bool = True) -> Path:
    """A work dir as 00-02 leave it (file contents stand-ins): kept best/ per fold, last/ with optimizer state, an
    interrupted run.new/, the feature arrays, the cache, the training rows' copy."""
    work = root / "work"
    _write(work / "params.json", json.dumps({**PARAMS, "folds": folds}))
    choice = Choice(get_preset("balanced"), metric="accuracy")
    run = resolve(choice, fake_profile("CPU", interactive=False)).to_dict()  # a whole run, as 01 saves it
    features = {"spec": {"kind": "binary", "num_labels": 2, "classes": ["neg", "pos"]}, "regime": "finetune",
                "run": run, "n_train": 200}  # fmt: skip
    _write(work / "features.json", json.dumps(features))
    _write(work / "run.json", "{}")
    _write(work / "features" / "labels-0123.npy")
    _write(work / "kitlib-cache" / "tokens-1" / "buffers.bin")
    _write(work / "tokenizer" / "tokenizer.json", "{}")
    _write(work / "train.csv", "id,text,label\n")
    _write(work / "run.new" / "last" / "state.pt")
    for run in ["run", *(f"run-fold{k}" for k in range(2, folds + 1))]:
        if trained:
            _write(work / run / "best" / "model.safetensors")
            _write(work / run / "best" / "manifest.json", "{}")
        _write(work / run / "last" / "model.safetensors")
        _write(work / run / "last" / "state.pt")  # optimizer and scheduler state: never published
        _write(work / run / "config.json", "{}")
        _write(work / run / "history.csv", "epoch\n")
        timing = {"phases": {"full_eval": {"seconds": 0.2, "count": 2}}, "run": {"device_type": "cpu"}}
        _write(work / run / "timing.json", json.dumps(timing))
    return work


def test_publish_holds_what_inference_needs_and_no_optimizer_state_last_or_training_rows(tmp_path: Path) -> None:
    work = _work(tmp_path, folds=3)
    out = tmp_path / "pub"
    assert (
        main(["kaggle", "publish", "--work-dir", str(work), "--out", str(out), "--dataset-id", "me/movie-model"]) == 0
    )
    files = sorted(str(f.relative_to(out)) for f in out.rglob("*") if f.is_file())
    per_run = ["best/manifest.json", "best/model.safetensors", "config.json", "history.csv", "timing.json"]
    assert files == sorted(
        [".kitlib-publish.json", "dataset-metadata.json", "features.json", "kitlib-model.json", "params.json",
         "run.json", "tokenizer/tokenizer.json",
         *(f"{run}/{name}" for run in ("run", "run-fold2", "run-fold3") for name in per_run)]
    )  # fmt: skip
    meta = json.loads((out / "dataset-metadata.json").read_text())
    assert meta["id"] == "me/movie-model"
    for said in ("task auto (binary) of 'label'", "labels ['neg', 'pos']", "metric accuracy", "numeric ['year']",
                 "kitlib 0.", "3 fold model(s)"):  # fmt: skip
        assert said in meta["description"]
    card = json.loads((out / inference.CARD_FILE).read_text())
    assert card["seconds_per_row"] == pytest.approx(0.2 / (2 * 200 / 3))  # 2 full evals of a third of the rows


def test_publish_refuses_a_work_dir_without_a_trained_best_checkpoint(tmp_path: Path) -> None:
    work = _work(tmp_path, trained=False)
    with pytest.raises(kg.KernelFolderError, match=r"no trained best/ checkpoint \(run\).*Fix: run 02_train"):
        kg.publish(work, tmp_path / "pub", dataset_id="me/movie-model")
    assert not (tmp_path / "pub").exists()  # nothing written


def test_publish_as_a_kaggle_model_writes_its_instance_metadata_and_pushes_through_the_cli(tmp_path: Path) -> None:
    ran: list[Sequence[str]] = []

    def runner(command: Sequence[str]) -> subprocess.CompletedProcess[str]:
        ran.append(list(command))
        return subprocess.CompletedProcess(command, 0, "done", "")

    out = tmp_path / "pub"
    kg.publish(_work(tmp_path), out, model_id="me/movie-model/pyTorch/v1", push=True, runner=runner)
    meta = json.loads((out / "model-instance-metadata.json").read_text())
    assert (meta["ownerSlug"], meta["modelSlug"], meta["framework"], meta["instanceSlug"]) == (
        "me", "movie-model", "pyTorch", "v1",
    )  # fmt: skip
    assert "labels ['neg', 'pos']" in meta["overview"]
    assert ran == [["kaggle", "models", "instances", "create", "-p", str(out), "-r", "zip"]]


def test_the_inference_kernel_is_offline_attaches_competition_model_and_wheels_and_never_trains(tmp_path: Path) -> None:
    args = ["kaggle", "build", "--username", "me", "--competition", "movie-reviews", "--wheels-dataset",
            "me/kitlib-wheels", "--out", str(tmp_path)]  # fmt: skip
    assert main([*args, "--infer-from", "me/movie-model", "--inference-limit", "2"]) == 0
    folder = tmp_path / kg.INFER_NAME
    meta = json.loads((folder / kg.METADATA_FILE).read_text())
    assert meta["enable_internet"] is False and meta["competition_sources"] == ["movie-reviews"]
    assert meta["dataset_sources"] == ["me/movie-model", "me/kitlib-wheels"] and meta["model_sources"] == []
    code = "".join("".join(c["source"]) for c in json.loads((folder / meta["code_file"]).read_text())["cells"])
    assert "inference_limit = 2.0" in code and "training.infer(p, feats, sample=" in code and "train(" not in code
    assert main([*args, "--infer-from", "me/movie-model/pyTorch/v1/1"]) == 0  # a Kaggle Model, with its version
    meta = json.loads((folder / kg.METADATA_FILE).read_text())
    assert meta["model_sources"] == ["me/movie-model/pyTorch/v1/1"] and meta["dataset_sources"] == ["me/kitlib-wheels"]


# ------------------------------------------------------------------------------------- the inference kernel's checks


def _data(root: Path, *, columns: Sequence[str] = ("id", "text", "year"), target: Any = "pos") -> Path:
    data = root / "data"
    data.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame({c: [f"h{i}" if c == "id" else i for i in range(6)] for c in columns})
    frame.to_csv(data / "test.csv", index=False)
    frame[["id"]].assign(label=target).to_csv(data / "sample_submission.csv", index=False)
    return data


def _card(root: Path) -> dict[str, Any]:
    return kg.model_card(_work(root))


def test_a_model_trained_on_other_columns_is_refused_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(SetupError, match=r"reads columns \['year'\] that test.csv lacks.*Fix: attach the model"):
        inference.check_against_data(_card(tmp_path), _data(tmp_path, columns=("id", "text")), PARAMS)


def test_a_classifier_for_a_number_target_is_refused_with_the_fix(tmp_path: Path) -> None:
    card = {**_card(tmp_path), "kind": "regression", "labels": []}
    inference.check_against_data(card, _data(tmp_path / "numbers", target=0.5), PARAMS)  # a number: predicts
    with pytest.raises(SetupError, match=r"predicts a number, but sample_submission.csv's 'label' holds text.*Fix"):
        inference.check_against_data(card, _data(tmp_path), PARAMS)


def test_another_label_set_is_refused_with_the_fix(tmp_path: Path) -> None:
    card = _card(tmp_path)
    assert inference.check_against_data(card, _data(tmp_path), PARAMS) == 6  # 'pos' is a label: passes
    with pytest.raises(SetupError, match=r"predicts the labels \['neg', 'pos'\], but .* holds \['spam'\].*Fix"):
        inference.check_against_data(card, _data(tmp_path / "spam", target="spam"), PARAMS)


def test_another_submission_target_is_refused_with_the_fix(tmp_path: Path) -> None:
    card = {**_card(tmp_path), "target": "sentiment"}
    with pytest.raises(SetupError, match=r"writes columns \['id', 'sentiment'\], sample_submission.csv has"):
        inference.check_against_data(card, _data(tmp_path), PARAMS)


def test_a_model_of_another_kitlib_version_is_refused_with_the_fix(tmp_path: Path) -> None:
    card = {**_card(tmp_path), "kitlib": "0.0.1"}
    with pytest.raises(SetupError, match=r"trained with kitlib 0.0.1.*Fix: attach the wheels dataset of kitlib 0.0.1"):
        inference.check_against_data(card, _data(tmp_path), PARAMS)


def test_a_test_set_that_cannot_be_predicted_within_inference_limit_is_refused_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "pub"
    kg.publish(_work(tmp_path), out, dataset_id="me/movie-model")
    data, work = _data(tmp_path), tmp_path / "kernel-working"
    with pytest.raises(SetupError, match=r"over inference_limit = 0.01 h: Kaggle would stop the rerun.*Fix"):
        inference.published_run(out, data_dir=data, work_dir=work, inference_limit=0.01)  # 36 s < the 60 s start
    assert not work.exists()  # refused before anything was copied
    said = capsys.readouterr().out
    assert "predicted 60 s for 6 test rows (measured: 5.00 ms a row in 02's evaluations on cpu" in said


def test_a_model_that_cannot_load_in_this_kernel_s_memory_is_refused_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "pub"
    kg.publish(_work(tmp_path), out, dataset_id="me/movie-model")
    monkeypatch.setattr(inference, "free_memory", lambda: 1)  # bytes
    work = tmp_path / "kernel-working"
    with pytest.raises(SetupError, match=r"loading one model .* \(Exceeded Allowed Compute\). Fix: a machine with"):
        inference.published_run(out, data_dir=_data(tmp_path), work_dir=work)
    assert not work.exists()


# --------------------------------------------------------------------------------------------- the submission's checks


def test_a_submission_with_other_ids_or_text_where_the_sample_has_numbers_is_never_written(tmp_path: Path) -> None:
    sample = tmp_path / "sample_submission.csv"
    pd.DataFrame({"id": [1, 2], "score": [0.0, 0.0]}).to_csv(sample, index=False)
    path = tmp_path / "submission.csv"
    with pytest.raises(DataError, match=r"ids are not sample_submission.csv's \(e.g. not in it: \['3'\]"):
        write_submission(pd.DataFrame({"id": [1, 3], "score": [0.1, 0.2]}), ["id", "score"], 2, path, sample)
    with pytest.raises(DataError, match=r"'score' holds text, sample_submission.csv's numbers"):
        write_submission(pd.DataFrame({"id": [1, 2], "score": ["a", "b"]}), ["id", "score"], 2, path, sample)
    with pytest.raises(DataError, match=r"'score' has inf values"):
        write_submission(pd.DataFrame({"id": [1, 2], "score": [0.1, float("inf")]}), ["id", "score"], 2, path, sample)
    assert not path.exists()
    write_submission(pd.DataFrame({"id": [2, 1], "score": [0.1, 0.2]}), ["id", "score"], 2, path, sample)
    assert path.is_file()


def test_a_work_dir_from_an_older_01_is_refused_with_the_notebook_to_rerun(tmp_path: Path) -> None:
    work = _work(tmp_path)
    feats = json.loads((work / "features.json").read_text())
    feats["run"] = {"format": 2, "metric": "accuracy", "config": {"adapter": "none"}}  # before the run held its choice
    (work / "features.json").write_text(json.dumps(feats))
    with pytest.raises(SetupError, match="re-run 01_features"):
        kg.model_card(work)
