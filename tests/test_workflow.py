"""The notebook stages as functions: data-fitted max_length, DDP workers for multi-GPU runs (gloo on CPU)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from kitlib.notebook import stages as workflow
from kitlib.notebook import training


def _csvs(folder: Path, n_train: int = 240, n_test: int = 40) -> Path:
    words = {"pos": ["great", "lovely", "superb"], "neg": ["awful", "dull", "boring"]}
    rows = [
        {"id": i, "text": f"a {words[('pos', 'neg')[i % 2]][i % 3]} film " + "long " * (i % 7), "label": i % 2}
        for i in range(n_train + n_test)
    ]
    frame = pd.DataFrame(rows)
    folder.mkdir()
    frame.iloc[:n_train].to_csv(folder / "train.csv", index=False)
    frame.iloc[n_train:][["id", "text"]].to_csv(folder / "test.csv", index=False)
    frame.iloc[n_train:][["id"]].assign(label=0).to_csv(folder / "sample_submission.csv", index=False)
    return folder


def test_features_fit_max_length_to_the_data_and_hand_the_fitted_run_on(tmp_path: Path, cpu_hw) -> None:
    """One writer per file: 00 writes run.json, 01 writes features.json (with the data-fitted run); 01 leaves
    run.json as 00 wrote it."""
    p = workflow.params(data_dir=_csvs(tmp_path / "data"), work_dir=tmp_path / "work", preset="smoke", model="tiny")
    run = workflow.setup(p, cpu_hw)  # the choice: no lengths known yet, nothing resolved
    written = (p.work_dir / "run.json").read_bytes()
    feats = workflow.features(p, hw=cpu_hw, quiet=True)
    assert (p.work_dir / "run.json").read_bytes() == written
    saved = workflow.load_features(p)
    assert saved.run.config.max_length == feats.max_length < run.preset.max_length_cap
    assert feats.max_length >= int(feats.train_tokens.lengths.max()) or feats.report is not None


def test_data_facts_give_the_picker_rows_and_lengths_before_anything_is_written(tmp_path: Path, cpu_hw) -> None:
    """00's picker cell gets train.csv's row count (each preset applies its row_limit) and rough lengths (words x
    1.3 + [CLS]/[SEP]) from data_facts: a time for every preset and max_length fitted to the data, not its cap."""
    import dataclasses
    import math

    from kitlib.data.tables import DataError
    from kitlib.notebook.widgets import preset_picker

    data = _csvs(tmp_path / "data", n_train=600)
    p = workflow.params(data_dir=data, work_dir=tmp_path / "work", preset="smoke", model="tiny")
    facts = workflow.data_facts(p)
    words = pd.read_csv(data / "train.csv")["text"].str.split().str.len()
    assert facts.n_rows == 600 and facts.lengths.tolist() == [math.ceil(w * 1.3) + 2 for w in words]
    assert not p.work_dir.exists()
    picker = preset_picker(cpu_hw, default=p.preset, n_rows=facts.n_rows, lengths=facts.lengths, show=False)
    assert "for 256 of 600 rows" in picker.estimate_text()
    assert picker.config.max_length < picker.resolved.preset.max_length_cap
    workflow.setup(p, cpu_hw)
    with pytest.raises(DataError, match="no column 'sentiment'"):  # setup's error for the same file, a cell earlier
        workflow.data_facts(dataclasses.replace(p, target="sentiment"))


def test_in_process_stages_train_with_the_run_01_resolved(tmp_path: Path, cpu_hw) -> None:
    """setup() saves a choice and knows no lengths; features() resolves it once, fitting max_length and the batch
    (min_steps) to the data, and 02 trains exactly that run."""
    import json

    p = workflow.params(data_dir=_csvs(tmp_path / "data"), work_dir=tmp_path / "work", preset="smoke", model="tiny")
    choice = workflow.setup(p, cpu_hw, overrides={"target_effective_batch": 32, "min_steps": 60})
    feats = workflow.features(p, choice, hw=cpu_hw, quiet=True)
    assert feats.run.effective_batch_size == 8  # 240 rows / 60 steps: 32 -> 8
    assert feats.run.config.max_length != choice.preset.max_length_cap
    training.train(p, feats, hw=cpu_hw)
    used = json.loads((p.run_dir / "config.json").read_text())
    trained = used.get("config", used)
    assert trained["micro_batch_size"] * trained["grad_accum_steps"] == feats.run.effective_batch_size
    assert trained["max_length"] == feats.run.config.max_length


def test_missing_earlier_stage_names_the_notebook_to_run(tmp_path: Path, cpu_hw) -> None:
    p = workflow.params(data_dir=_csvs(tmp_path / "data"), work_dir=tmp_path / "work", preset="smoke", model="tiny")
    with pytest.raises(FileNotFoundError, match="00_setup"):
        workflow.features(p, hw=cpu_hw)
    workflow.setup(p, cpu_hw)
    with pytest.raises(FileNotFoundError, match="01_features"):
        training.train(p, hw=cpu_hw)


@pytest.mark.slow
def test_a_run_resolved_for_two_devices_trains_in_two_ddp_workers(tmp_path: Path, cpu_hw) -> None:
    p = workflow.params(data_dir=_csvs(tmp_path / "data"), work_dir=tmp_path / "work", preset="smoke", model="tiny")
    workflow.setup(p, cpu_hw, world_size=2)
    workflow.features(p, hw=cpu_hw, quiet=True)
    result = training.train(p)  # forks 2 gloo workers; rank 0's result comes back
    assert result.timing["run"]["world_size"] == 2
    assert (p.run_dir / "best" / "model.safetensors").exists()
    submission = training.infer(p, hw=cpu_hw)
    assert len(submission) == 40


def test_best_checkpoint_follows_the_task_metric_when_every_epoch_computes_it() -> None:
    from kitlib.config import TrainConfig
    from kitlib.tasks.metrics import get_metric

    labels, numbers, smape = (
        get_metric("auto", "binary"),
        get_metric("auto", "regression"),
        get_metric("smape", "regression"),
    )
    every_epoch = TrainConfig(full_eval_every=1)
    chosen = training._monitor_task_metric(every_epoch, labels)
    assert (chosen.monitor, chosen.mode) == ("accuracy", "max")
    chosen = training._monitor_task_metric(every_epoch, numbers)
    assert (chosen.monitor, chosen.mode) == ("rmse", "min")
    chosen = training._monitor_task_metric(every_epoch, smape)
    assert (chosen.monitor, chosen.mode) == ("smape", "min")
    at_end_only = TrainConfig(full_eval_every=0)  # epochs without the metric: the loss decides
    assert training._monitor_task_metric(at_end_only, labels) == at_end_only
    by_hand = TrainConfig(full_eval_every=1, monitor="train_loss")
    assert training._monitor_task_metric(by_hand, labels) == by_hand


def test_paths_become_absolute_relative_to_where_the_user_ran_the_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shell_dir, kernel_dir = tmp_path / "shell", tmp_path / "kernel"
    for folder in (shell_dir / "data", shell_dir / "my-model", kernel_dir / "data"):
        folder.mkdir(parents=True)
    monkeypatch.chdir(kernel_dir)  # the kernel's cwd: the notebook's folder
    # KIT_* variables come from the shell, so they are relative to its PWD ...
    env = {"KIT_DATA_DIR": "data", "KIT_WORK_DIR": "out", "KIT_MODEL": "my-model", "PWD": str(shell_dir)}
    p = workflow.params(environ=env, data_dir="ignored", work_dir="ignored")
    assert (p.data_dir, p.work_dir, p.model) == (shell_dir / "data", shell_dir / "out", str(shell_dir / "my-model"))
    # ... the parameters cell's values are relative to the kernel's cwd, as in any Python code
    p = workflow.params(environ={}, data_dir="data", work_dir="out", model="org/hub-model")
    assert (p.data_dir, p.work_dir, p.model) == (kernel_dir / "data", kernel_dir / "out", "org/hub-model")
    assert workflow.params(environ={}, data_dir="data", work_dir="out", model="tiny").model == "tiny"


def test_train_and_infer_load_what_features_saved_without_csvs_or_tokenizers(
    tmp_path: Path, cpu_hw, monkeypatch: pytest.MonkeyPatch
) -> None:
    """02 and 03 read 01's hand-off only: no CSV read, no tokenizer loaded or trained, no text tokenized again."""
    import pandas as pd
    import transformers

    from kitlib.data import featurize, tables
    from kitlib.models import loading

    p = workflow.params(data_dir=_csvs(tmp_path / "data"), work_dir=tmp_path / "work", preset="smoke", model="tiny")
    workflow.setup(p, cpu_hw)
    workflow.features(p, hw=cpu_hw, quiet=True)
    calls: list[str] = []

    def forbidden(name: str):  # type: ignore[no-untyped-def]
        def call(*args: object, **kwargs: object) -> None:
            calls.append(name)
            raise AssertionError(f"a later stage called {name}")

        return call

    for owner, name in [
        (pd, "read_csv"),
        (tables, "read_table"),
        (transformers.AutoTokenizer, "from_pretrained"),
        (loading, "train_wordpiece_tokenizer"),
        (featurize, "tokenize_texts"),
    ]:
        monkeypatch.setattr(owner, name, forbidden(name))
    training.train(p, hw=cpu_hw)
    submission = training.infer(p, hw=cpu_hw)
    assert calls == []
    assert len(submission) == 40 and list(submission.columns) == ["id", "label"]
    assert submission["id"].tolist() == list(range(240, 280))  # ints stay ints, in test.csv's order


def test_features_built_for_another_run_or_parameters_are_refused(tmp_path: Path, cpu_hw) -> None:
    from kitlib.errors import MissingRunError

    data = _csvs(tmp_path / "data")
    p = workflow.params(data_dir=data, work_dir=tmp_path / "work", preset="smoke", model="tiny")
    workflow.setup(p, cpu_hw)
    workflow.features(p, hw=cpu_hw, quiet=True)
    workflow.setup(workflow.params(data_dir=data, work_dir=p.work_dir, preset="fast", model="tiny"), cpu_hw)
    with pytest.raises(MissingRunError, match=r"run.json changed .* re-run notebooks/01_features"):
        training.train(p, hw=cpu_hw)
    workflow.setup(p, cpu_hw)
    other = workflow.params(data_dir=data, work_dir=p.work_dir, preset="smoke", model="tiny", seed=7)
    with pytest.raises(MissingRunError, match=r"other parameters \(seed: 42 -> 7\)"):
        workflow.load_features(other)


def test_a_damaged_hand_off_array_names_the_file_and_the_notebook(tmp_path: Path, cpu_hw) -> None:
    from kitlib.errors import DataError

    p = workflow.params(data_dir=_csvs(tmp_path / "data"), work_dir=tmp_path / "work", preset="smoke", model="tiny")
    workflow.setup(p, cpu_hw)
    workflow.features(p, hw=cpu_hw, quiet=True)
    (labels,) = (p.work_dir / "features").glob("labels-*.npy")
    labels.write_bytes(labels.read_bytes()[:-8])
    with pytest.raises(DataError, match=r"labels-\w+\.npy is damaged .*truncated.* re-run notebooks/01_features"):
        workflow.load_features(p)


def test_sample_submission_problems_stop_features_before_any_training(tmp_path: Path, cpu_hw) -> None:
    from kitlib.errors import DataError

    data = _csvs(tmp_path / "data")
    p = workflow.params(data_dir=data, work_dir=tmp_path / "work", preset="smoke", model="tiny")
    workflow.setup(p, cpu_hw)
    sample = pd.read_csv(data / "sample_submission.csv")
    sample.iloc[:-1].to_csv(data / "sample_submission.csv", index=False)
    with pytest.raises(DataError, match=r"1 ids of test.csv are missing from sample_submission.csv"):
        workflow.features(p, hw=cpu_hw, quiet=True)
    sample.rename(columns={"label": "sentiment"}).to_csv(data / "sample_submission.csv", index=False)
    with pytest.raises(DataError, match=r"columns \['id', 'sentiment'\].*target='label'"):
        workflow.features(p, hw=cpu_hw, quiet=True)


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda data, tmp: data, r"work_dir is the data_dir"),
        (lambda data, tmp: (tmp / "afile").write_text("x") and tmp / "afile", r"is a file, not a folder"),
    ],
)
def test_an_unusable_work_dir_fails_in_the_first_cell(tmp_path: Path, make, expected: str) -> None:
    from kitlib.errors import SetupError

    data = _csvs(tmp_path / "data")
    before = {p: p.read_bytes() for p in data.iterdir()}
    with pytest.raises(SetupError, match=expected + r".*writable folder of its own"):
        workflow.params(data_dir=data, work_dir=make(data, tmp_path), preset="smoke", model="tiny")
    assert {p: p.read_bytes() for p in data.iterdir()} == before


def test_a_read_only_work_dir_fails_in_the_first_cell(tmp_path: Path) -> None:
    import os

    from kitlib.errors import SetupError

    if os.geteuid() == 0:
        pytest.skip("root can write anywhere: read-only needs another user")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    with pytest.raises(SetupError, match="not writable"):
        workflow.params(data_dir=_csvs(tmp_path / "data"), work_dir=locked / "work", preset="smoke", model="tiny")


class _Progress:
    """Records every bar made through kitlib.progress.progress_bar, wherever a kitlib module imported it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import sys

        from kitlib import progress

        self.bars: list[tuple[str, bool, object]] = []  # (desc, shown: not disabled when made, bar)
        make = progress.progress_bar

        def record(total: int | None, **kw: object):  # type: ignore[no-untyped-def]
            bar = make(total, **kw)  # type: ignore[arg-type]
            self.bars.append((str(kw["desc"]), not kw.get("disable", False), bar))
            return bar

        for module in [m for name, m in sys.modules.items() if name.startswith("kitlib")]:
            if getattr(module, "progress_bar", None) is make:  # its own name for the function, bound at import
                monkeypatch.setattr(module, "progress_bar", record)

    def named(self, prefix: str) -> list[tuple[int, int, bool]]:
        """(total, n, shown) of the bars whose description starts with ``prefix``, in the order they were made."""
        return [(bar.total, bar.n, shown) for desc, shown, bar in self.bars if desc.startswith(prefix)]  # type: ignore[attr-defined]


def _writable_only(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Spy on torch.from_numpy: its read-only-array warning shows once per process, so a warning filter alone would
    pass once any earlier test had triggered it."""
    import torch

    seen: list[bool] = []
    from_numpy = torch.from_numpy

    def spy(array):  # type: ignore[no-untyped-def]
        seen.append(bool(array.flags.writeable))
        return from_numpy(array)

    monkeypatch.setattr(torch, "from_numpy", spy)
    return seen


def test_the_head_regime_runs_all_four_stages_from_the_saved_features(
    tmp_path: Path, cpu_hw, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`fast` (frozen encoder, cached embeddings + n-grams, a small head): 02 and 03 build the head from what 01
    saved, and the head's predictions cover the test set. What the notebooks show: a bar over the embedding pass and
    over prediction, no torch warning about read-only arrays, no tokens/s for a head (it has no token inputs)."""
    import warnings

    p = workflow.params(data_dir=_csvs(tmp_path / "data"), work_dir=tmp_path / "work", preset="fast", model="tiny")
    choice = workflow.setup(p, cpu_hw)
    assert choice.preset.regime == "head"
    progress = _Progress(monkeypatch)
    feats = workflow.features(p, hw=cpu_hw)
    assert progress.named("embed") == [(240, 240, True), (40, 40, True)]  # train, then test texts
    assert feats.embeddings is not None and feats.embeddings[0].shape[0] == 240
    saved = workflow.load_features(p)
    assert saved.embeddings is not None and saved.ngrams is not None
    assert (saved.embeddings[1] == feats.embeddings[1]).all()
    assert all(a.flags.writeable for a in saved._arrays().values())  # loaded writable: torch shares, no copy
    writable = _writable_only(monkeypatch)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*NumPy array is not writable")
        result = training.train(p, hw=cpu_hw)
        for array in saved._arrays().values():  # as np.load(mmap_mode="r") or np.frombuffer(bytes) would give them
            array.setflags(write=False)
        submission = training.infer(p, saved, hw=cpu_hw)
    assert writable and all(writable)
    assert result.steps > 0 and "accuracy" in result.history
    assert "tokens_per_s" not in result.history and result.timing["run"]["real_tokens"] is None
    assert len(submission) == 40 and set(submission["label"]) <= {0, 1}
    assert progress.named("predict") == [(40, 40, True)]  # rows of the test set


def test_a_failed_training_run_never_replaces_the_last_good_one(tmp_path: Path, cpu_hw) -> None:
    from kitlib import Callback

    p = workflow.params(data_dir=_csvs(tmp_path / "data"), work_dir=tmp_path / "work", preset="smoke", model="tiny")
    workflow.setup(p, cpu_hw)
    workflow.features(p, hw=cpu_hw, quiet=True)
    first = training.train(p, hw=cpu_hw)
    assert first.run_dir == p.run_dir and (p.run_dir / "best" / "model.safetensors").is_file()
    good = {f.relative_to(p.run_dir): f.read_bytes() for f in p.run_dir.rglob("*") if f.is_file()}

    class Crash(Callback):
        def on_step_end(self, step: object) -> None:
            raise RuntimeError("the session died")

    with pytest.raises(RuntimeError, match="the session died"):
        training.train(p, hw=cpu_hw, callbacks=(Crash(),))
    assert {f.relative_to(p.run_dir): f.read_bytes() for f in p.run_dir.rglob("*") if f.is_file()} == good
    training.train(p, hw=cpu_hw)  # a finished run replaces run/, the previous one kept one step back
    assert (p.run_dir.with_name("run.prev") / "best" / "model.safetensors").read_bytes() == good[
        Path("best/model.safetensors")
    ]
    assert not p.run_dir.with_name("run.new").exists()


@pytest.mark.parametrize(
    ("train", "expected"),
    [
        (lambda f: f.iloc[:6], r"train.csv has 6 rows: after holding out 1 for validation, 5 are left, fewer than one"),
        (
            lambda f: f.assign(label=[f"c{i}" for i in range(len(f))]).iloc[:12],
            r"every one of its 12 classes has fewer than 2 rows \(class 'c\d+' has 1 row\): none can be validated",
        ),
        (  # a text-to-SQL table: nearly every target its own text, never read as 30+ classes of one row
            lambda f: f.assign(label=[f"SELECT name FROM t WHERE id = {i}" for i in range(len(f))]),
            r"holds \d+ distinct texts over \d+ rows .*not classes.*task = 'classify' if these really are class names",
        ),
    ],
)
def test_too_few_rows_or_too_rare_classes_stop_setup_before_anything_is_written(
    tmp_path: Path, cpu_hw, train, expected: str
) -> None:
    from kitlib.errors import DataError

    data = _csvs(tmp_path / "data")
    train(pd.read_csv(data / "train.csv")).to_csv(data / "train.csv", index=False)
    p = workflow.params(data_dir=data, work_dir=tmp_path / "work", preset="smoke", model="tiny")
    with pytest.raises(DataError, match=expected):  # the batch is 01's: its resolution sizes it
        workflow.setup(p, cpu_hw)
        workflow.features(p, hw=cpu_hw, quiet=True)
    assert not (p.work_dir / ("features.json" if "fewer than one" in expected else "run.json")).exists()


def test_a_sigtermed_training_keeps_run_and_the_next_one_continues_it_exactly(tmp_path: Path, cpu_hw) -> None:
    """What a restarted Kaggle/Colab session sees: 02 stopped by SIGTERM left run/ alone and run.new/last behind;
    running 02 again continues that attempt (same config, same features) to the weights of an uninterrupted run."""
    import os
    import signal

    import torch

    from kitlib import Callback

    data = _csvs(tmp_path / "data")

    def stages_to_features(work: Path) -> workflow.Params:
        p = workflow.params(data_dir=data, work_dir=work, preset="smoke", model="tiny")
        workflow.setup(p, cpu_hw)
        workflow.features(p, hw=cpu_hw, quiet=True)
        return p

    whole = training.train(stages_to_features(tmp_path / "whole"), hw=cpu_hw)
    assert whole.steps >= 4

    class Term(Callback):
        def on_step_end(self, step: object) -> None:
            if self.loop.state.step == 3:
                os.kill(os.getpid(), signal.SIGTERM)

        def on_fit_start(self, loop: object) -> None:
            self.loop = loop

    p = stages_to_features(tmp_path / "cut")
    stopped = training.train(p, hw=cpu_hw, callbacks=(Term(),))
    # signalled after step 3's policies ran: kitlib finishes the step in flight (4), saves last/, stops
    assert stopped.stop_reason == "sigterm" and stopped.steps == 4
    assert not p.run_dir.exists() and (p.run_dir.with_name("run.new") / "last" / "manifest.json").is_file()
    resumed = training.train(p, hw=cpu_hw)
    assert resumed.run_dir == p.run_dir and (p.run_dir / "best").is_dir()
    expected, got = whole.model.state_dict(), resumed.model.state_dict()
    assert all(torch.equal(t, got[n]) for n, t in expected.items())


def test_an_interrupted_attempt_with_other_inputs_is_not_continued(tmp_path: Path, cpu_hw) -> None:
    import json

    p = workflow.params(data_dir=_csvs(tmp_path / "data"), work_dir=tmp_path / "work", preset="smoke", model="tiny")
    workflow.setup(p, cpu_hw)
    workflow.features(p, hw=cpu_hw, quiet=True)
    staging = p.run_dir.with_name("run.new")
    staging.mkdir()
    inputs = {"config": {"lr": 1.0}, "features": "another"}
    (staging / "inputs.json").write_text(json.dumps(inputs))
    (staging / "last").mkdir()
    training.train(p, hw=cpu_hw)  # fresh: the other attempt is superseded, and the run finishes
    assert (p.run_dir / "best").is_dir() and not staging.exists()


def test_features_say_why_max_length_differs_from_what_00_showed(
    tmp_path: Path, cpu_hw, capsys: pytest.CaptureFixture[str]
) -> None:
    """00's picker fits max_length to word counts x 1.3; 01 to the tokenizer's counts: a changed value is explained."""
    from kitlib.notebook.widgets import preset_picker

    data = _csvs(tmp_path / "data")
    train = pd.read_csv(data / "train.csv")
    train.assign(text=train["text"] + " and so on" * 8).to_csv(data / "train.csv", index=False)  # ~30 words a row
    p = workflow.params(data_dir=data, work_dir=tmp_path / "work", preset="smoke", model="tiny")
    facts = workflow.data_facts(p)
    picker = preset_picker(cpu_hw, default=p.preset, n_rows=facts.n_rows, lengths=facts.lengths, show=False)
    shown = picker.config.max_length  # 00's preview
    workflow.setup(p, cpu_hw)
    capsys.readouterr()
    feats = workflow.features(p, hw=cpu_hw)
    assert feats.max_length != shown  # the tiny tokenizer splits these words less than 1.3 tokens each
    assert f"max_length {feats.max_length}: covers 90% of 240 rows" in capsys.readouterr().out  # 01's one resolution
